"""`kernelforge doctor`: what this machine has for each stage (Python, nvcc, the sandbox, GPU, pycuda, ncu, torch)."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import sys

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.cli.output import EXIT_FAILED, EXIT_OK
from kernelforge_tui.config import ConfigError, Settings, config_file, load_settings
from kernelforge_tui.gpu.build import find_nvcc, nvcc_version
from kernelforge_tui.gpu.detect import detect_gpus, pycuda_problem
from kernelforge_tui.gpu.sandbox import sandbox_status


class Check(BaseModel):
    """One line of `kernelforge doctor`."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def doctor_checks() -> list[Check]:
    """What this machine has for each stage, and the fix for what it lacks."""
    checks: list[Check] = []

    def add(name: str, ok: bool, detail: str, fix: str = "") -> None:
        checks.append(Check(name=name, ok=ok, detail=detail, fix="" if ok else fix))

    add("python", sys.version_info >= (3, 11), platform.python_version(), "use Python 3.11 or newer")
    settings: Settings | None = None
    try:
        settings = load_settings()
        add("config", True, str(config_file()) if config_file().is_file() else "no config file: defaults")
    except ConfigError as exc:
        add("config", False, exc.what(), exc.fix)
    nvcc = find_nvcc(settings.build.nvcc if settings else None)
    if nvcc is None:
        add("nvcc", False, "not found", "install the CUDA toolkit, or set KERNELFORGE_BUILD__NVCC to nvcc's path")
    else:
        try:
            add("nvcc", True, f"{nvcc_version(nvcc)} ({nvcc})")
        except (OSError, ValueError) as exc:
            add("nvcc", False, str(exc), "repair the CUDA toolkit installation")
    sandbox = sandbox_status()
    add(
        "compiler sandbox",
        sandbox.mode != "limits",
        sandbox.description,
        "install bubblewrap (apt install bubblewrap) or allow unprivileged user namespaces, so nvcc cannot read "
        "host files",
    )
    gpus = detect_gpus()
    for gpu in gpus:
        add(f"gpu {gpu.index}", True, f"{gpu.name}, compute capability {gpu.capability}, {gpu.memory_mib} MiB")
    if gpus:
        add("driver", True, gpus[0].driver)
    else:
        add(
            "gpu",
            False,
            "no NVIDIA GPU found (nvidia-smi is missing or lists none)",
            "evaluate on a machine with an NVIDIA GPU and its driver; cards and builds work without one",
        )
    problem = pycuda_problem()
    add(
        "pycuda",
        problem is None,
        _version("pycuda") if problem is None else "not installed",
        "pip install 'kernelforge-tui[gpu]'",
    )
    ncu = shutil.which("ncu")
    add("ncu", ncu is not None, ncu or "not found", "install Nsight Compute (in the CUDA toolkit) for profiling")
    torch = importlib.util.find_spec("torch") is not None
    add(
        "torch",
        torch,
        _version("torch") if torch else "not installed",
        "pip install 'kernelforge-tui[torch]' to capture PyTorch models",
    )
    return checks


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    checks = doctor_checks()
    if args.json:
        print(json.dumps([c.model_dump() for c in checks], indent=2))
    else:
        table = Table(title="kernelforge doctor", show_lines=False)
        for column in ("part", "", "found", "fix"):
            table.add_column(column)
        for c in checks:
            table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]missing[/]", escape(c.detail), escape(c.fix))
        console.print(table)
    essential = {"python", "config", "nvcc"}
    return EXIT_OK if all(c.ok for c in checks if c.name in essential) else EXIT_FAILED
