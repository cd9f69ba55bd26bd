"""compute-sanitizer over one kernel's launch: memcheck (out-of-bounds and misaligned accesses), racecheck (shared
memory hazards between threads), initcheck (reads of memory nothing wrote).

The launch is `cast.probe launch`: the runtime's own launch path on torch tensors, each its own allocation
(PYTORCH_NO_CUDA_MEMORY_CACHING=1), inputs ending where their allocation ends, so memcheck sees a write past an
output's or an input's end, and initcheck a read before an input's start. A tool passes when it reports no error
and the launch program says it launched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from kernelforge_tui.cast.manifest import SanitizerTool
from kernelforge_tui.gpu.build import find_nvcc

TIMEOUT_ENV = "KERNELFORGE_SANITIZER_TIMEOUT"
"""Seconds one tool may take over one launch (default 900): racecheck instruments every shared-memory access."""
ERROR_EXIT = 86
"""--error-exitcode: what the tool exits with when it found an error (any other non-zero: the program failed)."""
REPORT_CHARS = 20_000
_SUMMARY = re.compile(r"(ERROR SUMMARY: \d+ errors?|RACECHECK SUMMARY: [^\n]+)")
_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?")


class ToolResult(BaseModel):
    tool: SanitizerTool
    ok: bool
    summary: str
    report: str
    seconds: float


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, beside nvcc, or under $CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    nvcc = find_nvcc()
    places = [Path(nvcc).resolve().parent] if nvcc else []
    places += [Path(r) / "bin" for r in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if r]
    for place in places:
        for candidate in (place / "compute-sanitizer", place.parent / "compute-sanitizer" / "compute-sanitizer"):
            if candidate.is_file():
                return str(candidate)
    return None


def command(sanitizer: str, tool: str, package: Path, kernel: str, python: str = sys.executable) -> list[str]:
    argv = [sanitizer, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "50"]
    if tool == "memcheck":
        # API errors are the host's business (the probe checks every return code); cuda-bindings resolves the
        # driver's entry points up front and the ones this driver lacks come back "not found", which memcheck would
        # count as errors of an honest kernel. Only the kernel's own memory accesses decide here.
        argv += ["--leak-check", "no", "--report-api-errors", "no"]
    if tool == "racecheck":
        argv += ["--racecheck-report", "all"]
    return [*argv, python, "-m", "kernelforge_tui.cast.probe", "launch", str(package), kernel]


def run_tool(
    sanitizer: str, tool: SanitizerTool, package: Path, kernel: str, timeout_s: float | None = None
) -> ToolResult:
    if timeout_s is None:
        timeout_s = float(os.environ.get(TIMEOUT_ENV, "900"))
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command(sanitizer, tool, package, kernel),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return ToolResult(
            tool=tool,
            ok=False,
            summary=f"{tool} ran longer than {timeout_s:g} s (raise {TIMEOUT_ENV} to wait longer)",
            report=text[-REPORT_CHARS:],
            seconds=time.perf_counter() - started,
        )
    output = done.stdout + done.stderr
    return judge(tool, done.returncode, output, time.perf_counter() - started)


def judge(tool: SanitizerTool, returncode: int, output: str, seconds: float = 0.0) -> ToolResult:
    """A tool's verdict from its exit code and output."""
    summaries = _SUMMARY.findall(output)
    errors = sum(int(a or b or 0) for a, b in _ERRORS.findall(output))
    launched = "probe: launched" in output
    if returncode == ERROR_EXIT or errors:
        summary = summaries[-1] if summaries else f"{tool} reported errors"
        ok = False
    elif returncode != 0 or not launched:
        lines = [line for line in output.splitlines() if line.startswith("probe:")]
        summary = f"the launch did not complete (exit {returncode}): {lines[-1] if lines else output.strip()[-300:]}"
        ok = False
    else:
        summary = summaries[-1] if summaries else f"{tool}: no errors"
        ok = True
    return ToolResult(tool=tool, ok=ok, summary=summary, report=output[-REPORT_CHARS:], seconds=seconds)
