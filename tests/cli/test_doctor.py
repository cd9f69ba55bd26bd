"""`kernelforge doctor`'s verdict (its exit code says whether the main job can run here) and its install lines, which
fit a source checkout (`pip install -e '.[gpu]'`) and an installed package alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelforge_tui
from kernelforge_tui.build.nvcc import find_nvcc
from kernelforge_tui.cli import doctor
from kernelforge_tui.cli.doctor import Check, install_fix, verdict
from kernelforge_tui.cli.main import main
from kernelforge_tui.errors import checkout
from kernelforge_tui.gpu.detect import GpuInfo
from tests.conftest import ROOT

ALL = ("python", "config", "nvcc", "compiler sandbox", "gpu 0", "driver", "pycuda", "ncu", "torch", "llm")


def checks(*missing: str) -> list[Check]:
    return [Check(name=name, ok=name not in missing, detail="") for name in (*ALL, *missing)]


@pytest.mark.parametrize(
    ("missing", "code", "words"),
    [
        ((), 0, "ready: kernels can be built, proven correct and timed here"),
        (("ncu", "torch", "compiler sandbox"), 0, "without ncu the search runs unprofiled"),  # narrower, not stopped
        (("gpu",), 3, "kernels build here but cannot run (missing: gpu)"),
        (("pycuda",), 3, "(missing: pycuda)"),
        (("gpu", "pycuda", "ncu"), 3, "eval and optimize need a GPU and pycuda"),
        (("nvcc", "gpu"), 1, "nothing can be built here: fix nvcc first"),
        (("llm fast",), 1, "a configured LLM model does not answer"),
    ],
)
def test_the_exit_code_says_whether_the_main_job_can_run(missing: tuple[str, ...], code: int, words: str) -> None:
    got, line = verdict(checks(*missing))
    assert got == code and words in line, line


def test_in_a_checkout_the_fix_installs_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    python = Path(sys.executable)
    pip = str(python.relative_to(ROOT)) if python.is_relative_to(ROOT) else str(python)
    assert install_fix("gpu") == f"{pip} -m pip install -e '.[gpu]'"
    monkeypatch.chdir("/")
    assert install_fix("torch").endswith(f"-m pip install -e '{ROOT}[torch]'")


def test_an_installed_package_gets_the_package_from_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site-packages" / "kernelforge_tui"
    site.mkdir(parents=True)
    monkeypatch.setattr(kernelforge_tui, "__file__", str(site / "__init__.py"))
    assert checkout() is None
    assert install_fix("gpu").endswith(" -m pip install 'kernelforge-tui[gpu]'")


def test_doctor_prints_the_verdict_and_exits_with_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # the fix line names this checkout's python, whose path may be long
    monkeypatch.setattr(doctor, "detect_gpus", lambda: [])
    monkeypatch.setattr(doctor, "pycuda_problem", lambda: "pycuda is not installed")
    assert main(["doctor"]) == 3
    out = capsys.readouterr().out
    assert "kernels build here but cannot run (missing: gpu, pycuda)" in out
    assert "-m pip install -e" in out  # this test runs from the checkout
    gpu = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-0", capability="9.0", driver="570.124.06", memory_mib=1)
    monkeypatch.setattr(doctor, "detect_gpus", lambda: [gpu])
    monkeypatch.setattr(doctor, "pycuda_problem", lambda: None)
    code = main(["doctor"])
    assert code == (0 if find_nvcc(None) else 1)  # CI has nvcc
