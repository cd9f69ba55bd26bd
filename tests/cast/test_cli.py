"""`kernelforge run` and `verify` on a machine without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelforge_tui.cast.manifest import Machine
from kernelforge_tui.cli.main import main
from kernelforge_tui.gpu.detect import detect_gpus
from tests.support.fixtures.cast.cast_support import MACHINE, softmax_entry, write_cast

SCRIPT = """
import sys
from pathlib import Path
Path(sys.argv[1]).write_text(" ".join(sys.argv[2:]) + f" {__name__}")
raise SystemExit(int(sys.argv[2]))
"""


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return script


def test_run_gives_the_script_its_argv_and_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    package = write_cast(tmp_path / "m.cast", [softmax_entry()])
    monkeypatch.setenv("KERNELFORGE_CAST", "off")
    code = main(["run", str(package), str(_script(tmp_path)), str(tmp_path / "out.txt"), "7", "--flag"])
    assert code == 7
    assert (tmp_path / "out.txt").read_text() == "7 --flag __main__"
    assert "turned off by KERNELFORGE_CAST=off" in capsys.readouterr().err


@pytest.mark.skipif(bool(detect_gpus()), reason="this machine has a GPU")
def test_run_without_a_cuda_device_runs_eagerly_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device")
    package = write_cast(tmp_path / "m.cast", [softmax_entry()])
    with pytest.warns(RuntimeWarning, match="no CUDA device here"):
        code = main(["run", str(package), str(_script(tmp_path)), str(tmp_path / "out.txt"), "0"])
    assert code == 0 and (tmp_path / "out.txt").read_text() == "0 __main__"
    assert "no CUDA device: every call runs eagerly" in capsys.readouterr().err


def test_run_refuses_a_package_not_checked_on_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    package = write_cast(tmp_path / "m.cast", [softmax_entry()], machine=None)
    code = main(["run", str(package), str(_script(tmp_path)), str(tmp_path / "out.txt"), "0"])
    assert code == 2 and not (tmp_path / "out.txt").exists()
    assert "is not checked on a GPU yet" in " ".join(capsys.readouterr().out.split())


@pytest.mark.skipif(bool(detect_gpus()), reason="this machine has a GPU")
def test_verify_without_a_gpu_says_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    package = write_cast(tmp_path / "m.cast", [softmax_entry()], machine=None)
    before = package.read_bytes()
    code = main(["verify", str(package), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3 and out["error"] == "no-gpu" and "no NVIDIA GPU" in out["message"]
    assert "machine with the GPU the package is for" in out["message"] and "--no-sanitize" not in out["message"]
    assert package.read_bytes() == before


def test_verify_refuses_a_garbage_file_before_it_asks_for_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.cast"
    garbage.write_bytes(b"not a zip at all")
    code = main(["verify", str(garbage), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and "not a readable zip" in out["message"]


def test_verify_refuses_a_package_of_no_kernel_and_leaves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = write_cast(tmp_path / "empty.cast", [], machine=None)
    before = package.read_bytes()
    code = main(["verify", str(package), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and "holds no kernel" in out["message"] and "left as it was" in out["message"]
    assert package.read_bytes() == before


def _gpu_checks_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify's GPU side faked: a GPU and its tools here, and every kernel disagreeing with eager PyTorch."""
    from kernelforge_tui.build import nvcc as build
    from kernelforge_tui.cast import verify
    from kernelforge_tui.cast.probe import KernelCheck

    def probe(package: Path, kernels: list[str], progress: object) -> tuple[dict[str, KernelCheck], Machine]:
        return {k: KernelCheck(kernel=k, ok=False, reason="set fresh:7001: disagrees") for k in kernels}, MACHINE

    monkeypatch.setattr(verify, "require_gpu_tools", lambda help_text: None)
    monkeypatch.setattr(verify, "find_sanitizer", lambda: "compute-sanitizer")
    monkeypatch.setattr(build, "detect_arch", lambda: "sm_90")
    monkeypatch.setattr(verify, "run_probe", probe)


def test_verify_where_no_kernel_passes_leaves_the_package_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _gpu_checks_fail(monkeypatch)
    package = write_cast(tmp_path / "m.cast", [softmax_entry()], machine=None)
    before = package.read_bytes()
    code = main(["verify", str(package)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1 and package.read_bytes() == before
    assert "nothing written" in out and f"{package} is left as it was" in out and "disagrees" in out
    elsewhere = tmp_path / "out.cast"
    code = main(["verify", str(package), "--output", str(elsewhere), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 1 and summary["package"] is None and summary["kernels"] == []
    assert summary["audit"][0]["decision"] == "fallback" and not elsewhere.exists()
