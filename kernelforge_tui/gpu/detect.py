"""Find GPUs without touching a driver API: `nvidia-smi` answers (or is missing) without hanging."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

from pydantic import BaseModel

from kernelforge_tui.errors import NoGpu


class GpuInfo(BaseModel):
    index: int
    name: str
    uuid: str
    capability: str
    """Like "9.0"."""
    driver: str
    memory_mib: int

    @property
    def arch(self) -> str:
        return "sm_" + self.capability.replace(".", "")


def gpu_label(gpu: GpuInfo) -> str:
    """Which GPU of which machine, as a run records who measured a candidate."""
    return f"{socket.gethostname()} GPU {gpu.index} {gpu.name}"


class NoGpuError(NoGpu):
    """No usable NVIDIA GPU: the message says what is missing and how to fix it (exit code 3)."""


QUERY = "index,name,uuid,compute_cap,driver_version,memory.total"


def detect_gpus(timeout_s: float = 15.0) -> list[GpuInfo]:
    """The GPUs this process may use (`CUDA_VISIBLE_DEVICES` respected, see `visible`); [] where there are none.
    Each keeps nvidia-smi's index: workers are pinned by it, whatever the parent's CUDA_VISIBLE_DEVICES."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        index, name, uuid, cap, driver, memory = parts
        gpus.append(
            GpuInfo(
                index=int(index), name=name, uuid=uuid, capability=cap, driver=driver, memory_mib=int(float(memory))
            )
        )
    return visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible(gpus: list[GpuInfo], mask: str | None) -> list[GpuInfo]:
    """The GPUs a `CUDA_VISIBLE_DEVICES` value lets through, in its order, read as CUDA reads it: indices or UUID
    prefixes, the list ending at the first entry that names no GPU (an empty value hides them all; unset, all)."""
    if mask is None:
        return gpus
    chosen: list[GpuInfo] = []
    for entry in (e.strip() for e in mask.split(",")):
        match = [
            g
            for g in gpus
            if (entry.isdigit() and g.index == int(entry)) or (entry.startswith("GPU-") and g.uuid.startswith(entry))
        ]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def pycuda_problem() -> str | None:
    """Why pycuda cannot be used here, or None (imports it only as a module spec: no driver call)."""
    import importlib.util

    if importlib.util.find_spec("pycuda") is None:
        return "pycuda is not installed: pip install 'kernelforge-tui[gpu]' (builds against the CUDA toolkit, ~75 s)"
    return None


def require_gpu() -> list[GpuInfo]:
    """The GPUs, or a NoGpuError that says what is missing and the fix."""
    gpus = detect_gpus()
    if not gpus:
        raise NoGpuError(
            "no NVIDIA GPU found (nvidia-smi is missing or lists none). Evaluation runs kernels on a GPU: "
            "run this on a machine with an NVIDIA GPU and its driver; building and card checks work without one."
        )
    problem = pycuda_problem()
    if problem:
        raise NoGpuError(problem)
    return gpus
