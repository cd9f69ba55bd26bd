"""`doctor` and `eval` on a machine without a GPU (CI): a clear message, the right exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import EXAMPLES

NO_DRIVER = "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"


@pytest.fixture
def no_gpu_path(tmp_path: Path) -> str:
    """A PATH with nvcc and an nvidia-smi that finds no driver, as in a container without a GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NO_DRIVER)
    smi.chmod(0o755)
    nvcc = shutil.which("nvcc")
    assert nvcc is not None, "CI has nvcc"
    (bin_dir / "nvcc").symlink_to(nvcc)
    return f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin"


def kernelforge(*args: str, path: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=path, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "kernelforge_tui.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_doctor_names_the_missing_gpu_and_the_fix(no_gpu_path: str) -> None:
    done = kernelforge("doctor", "--json", path=no_gpu_path)
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert checks["nvcc"]["ok"] and checks["nvcc"]["detail"].startswith("13.")
    assert not checks["gpu"]["ok"] and "no NVIDIA GPU" in checks["gpu"]["detail"]
    assert "NVIDIA GPU" in checks["gpu"]["fix"]
    assert done.returncode == 0  # python and nvcc are there: cards and builds work


def test_eval_says_clearly_that_no_gpu_is_present(no_gpu_path: str) -> None:
    card = EXAMPLES / "cards" / "vector_add_f32"
    kernel = sorted((card / "candidates").glob("*.cu"))[0]
    done = kernelforge("eval", str(card), str(kernel), path=no_gpu_path)
    assert done.returncode == 3
    assert "no NVIDIA GPU found" in done.stdout
    as_json = kernelforge("eval", str(card), str(kernel), "--json", path=no_gpu_path)
    reply = json.loads(as_json.stdout)
    assert reply["ok"] is False and reply["error"] == "no-gpu" and "no NVIDIA GPU found" in reply["message"]
    assert as_json.returncode == 3


def test_eval_names_a_broken_card(no_gpu_path: str, tmp_path: Path) -> None:
    (tmp_path / "card.toml").write_text('name = "x"\nfamily = "softmax"\nsizes = { rows = -1 }\n')
    kernel = tmp_path / "k.cu"
    kernel.write_text('extern "C" __global__ void k() {}\n')
    done = kernelforge("eval", str(tmp_path), str(kernel), path=no_gpu_path)
    assert done.returncode == 2
    assert "card.toml" in done.stdout and "Fix:" in done.stdout
