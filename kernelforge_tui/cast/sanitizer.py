"""compute-sanitizer over one kernel's launch: memcheck (out-of-bounds and misaligned accesses), racecheck (shared
memory hazards between threads), initcheck (reads of memory nothing wrote).

The launch is `cast.probe launch`: the runtime's own launch path on torch tensors, each its own allocation
(PYTORCH_NO_CUDA_MEMORY_CACHING=1), inputs ending where their allocation ends, so memcheck sees a write past an
output's or an input's end, and initcheck a read before an input's start. A tool passes when it reports no error
and the launch program says it launched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from kernelforge_tui.build.nvcc import find_nvcc
from kernelforge_tui.cast.manifest import SanitizerTool

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
    # API errors are the host's business (the probe checks every return code and says whether it launched):
    # cuda-bindings looks up every driver entry point it knows (cuGetProcAddress) and the ones this driver lacks come
    # back "not found". On the H200 memcheck counted 34 of them ("Program hit CUDA_ERROR_NOT_FOUND ... on CUDA API
    # call to cuGetProcAddress_v2", backtrace into cydriver) as errors of an honest kernel; any tool reports them.
    # Only the kernel's own accesses decide here.
    argv = [sanitizer, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "50"]
    argv += ["--report-api-errors", "no"]
    if tool == "memcheck":
        argv += ["--leak-check", "no"]
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
    returncode, output, timed_out = run_group(command(sanitizer, tool, package, kernel), timeout_s, env)
    if timed_out:
        return ToolResult(
            tool=tool,
            ok=False,
            summary=f"{tool} ran longer than {timeout_s:g} s (raise {TIMEOUT_ENV} to wait longer)",
            report=clip(output),
            seconds=time.perf_counter() - started,
        )
    return judge(tool, returncode, output, time.perf_counter() - started)


def run_group(argv: list[str], timeout_s: float, env: dict[str, str]) -> tuple[int, str, bool]:
    """(exit code, stdout and stderr, whether it timed out). On a timeout the whole process group goes: the tool
    and the program it runs (killing compute-sanitizer alone would leave the probe on the GPU, still running under
    instrumentation, beside whatever is measured next)."""
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return process.returncode, _text(out) + _text(err), True
    return process.returncode, out + err, False


_PREFIX = "========= "
_NOT_ERRORS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def errors_found(output: str) -> list[tuple[str, list[str]]]:
    """Each error the tool printed, in order: its first line (`Invalid __global__ write of size 2 bytes`,
    `Program hit CUDA_ERROR_NOT_FOUND ... on CUDA API call to cuGetProcAddress_v2.`, `Error: Race reported between
    ...`) and its detail lines (where in the kernel, which thread, which address), host and device frames left
    out."""
    found: list[tuple[str, list[str]]] = []
    for line in output.splitlines():
        if not line.startswith(_PREFIX.rstrip()):
            continue
        text = line[len(_PREFIX) :] if line.startswith(_PREFIX) else ""
        if not text.strip():
            continue
        if not text.startswith(" "):
            if not text.startswith(_NOT_ERRORS):
                found.append((text.strip(), []))
        elif found and "Frame:" not in text and "backtrace" not in text:
            found[-1][1].append(text.strip())
    return found


def first_errors(output: str, kinds: int = 3) -> str:
    """The errors in words, for a summary: the first one with its details, then how many of each kind (addresses
    aside), at most `kinds` kinds."""
    found = errors_found(output)
    if not found:
        return ""
    head, details = found[0]
    text = f"first: {head}" + (f" ({'; '.join(details[:4])})" if details else "")
    counts: dict[str, int] = {}
    for line, _ in found:
        key = _ADDRESS.sub("0x...", line)
        counts[key] = counts.get(key, 0) + 1
    if len(found) > 1:
        shown = [f"{n} x {key}" for key, n in list(counts.items())[:kinds]]
        more = len(counts) - kinds
        text += f"; printed: {', '.join(shown)}" + (f" and {more} more kinds" if more > 0 else "")
    return text


def clip(output: str, limit: int = REPORT_CHARS) -> str:
    """The report kept: all of it when short, else its beginning (the first errors) and its end (the summary)."""
    if len(output) <= limit:
        return output
    head = limit * 2 // 3
    tail = limit - head
    left = len(output) - head - tail
    return f"{output[:head]}\n[... {left} characters left out ...]\n{output[-tail:]}"


def _text(output: str | bytes | None) -> str:
    """What a timed-out run had printed (bytes even with text=True, on some Pythons)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def judge(tool: SanitizerTool, returncode: int, output: str, seconds: float = 0.0) -> ToolResult:
    """A tool's verdict from its exit code and output; a failure's summary names the first error."""
    summaries = _SUMMARY.findall(output)
    errors = sum(int(a or b or 0) for a, b in _ERRORS.findall(output))
    launched = "probe: launched" in output
    if returncode == ERROR_EXIT or errors:
        summary = summaries[-1] if summaries else f"{tool} reported errors"
        first = first_errors(output)
        summary += f"; {first}" if first else ""
        ok = False
    elif returncode != 0 or not launched:
        lines = [line for line in output.splitlines() if line.startswith("probe:")]
        summary = f"the launch did not complete (exit {returncode}): {lines[-1] if lines else output.strip()[-300:]}"
        first = first_errors(output)
        summary += f"; {first}" if first else ""
        ok = False
    else:
        summary = summaries[-1] if summaries else f"{tool}: no errors"
        ok = True
    return ToolResult(tool=tool, ok=ok, summary=summary, report=clip(output), seconds=seconds)
