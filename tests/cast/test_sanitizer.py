"""The sanitizer gate's verdicts, from compute-sanitizer's exit codes and summaries (the runs are on the GPU:
tests/gpu/test_cast.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kernelforge_tui.cast.manifest import SANITIZER_TOOLS
from kernelforge_tui.cast.sanitizer import ERROR_EXIT, clip, command, judge, run_group

MEMCHECK_ERROR = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 2 bytes
=========     at cheat_out_of_bounds+0x5e0
=========     by thread (0,0,0) in block (20,0,0)
=========     Address 0x7f0c4a00a48e is out of bounds
probe: launched cheat_out_of_bounds once
========= ERROR SUMMARY: 8 errors
"""
RACECHECK_ERROR = """========= COMPUTE-SANITIZER
========= Error: Race reported between Read access at racy_softmax+0x3a0
=========     and Write access at racy_softmax+0x1f0 [256 hazards]
probe: launched racy_softmax once
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
CLEAN = """========= COMPUTE-SANITIZER
probe: launched softmax_block_row_bf16 once
========= ERROR SUMMARY: 0 errors
"""


# What memcheck printed on the H200 for an honest kernel launched through cuda-bindings (34 of these, before
# `--report-api-errors no`): the driver entry points the binding looks up and this driver lacks.
API_ERRORS = (
    "========= COMPUTE-SANITIZER\n"
    + "".join(
        f"""========= Program hit CUDA_ERROR_NOT_FOUND (error 500) due to "named symbol not found" on CUDA API call to \
cuGetProcAddress_v2.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: [0x{0x2E5F1B + i:x}] in libcuda.so.1
=========         Host Frame: [0x115c6] in cydriver.cpython-312-x86_64-linux-gnu.so
=========         Host Frame: main in probe.py:315
=========
"""
        for i in range(34)
    )
    + "probe: launched softmax_block_row_bf16 once\n========= ERROR SUMMARY: 34 errors\n"
)


def test_an_error_summary_fails_the_tool_and_names_the_first_error() -> None:
    verdict = judge("memcheck", ERROR_EXIT, MEMCHECK_ERROR)
    assert not verdict.ok
    assert verdict.summary == (
        "ERROR SUMMARY: 8 errors; first: Invalid __global__ write of size 2 bytes (at cheat_out_of_bounds+0x5e0; "
        "by thread (0,0,0) in block (20,0,0); Address 0x7f0c4a00a48e is out of bounds)"
    )
    assert "Invalid __global__ write" in verdict.report


def test_host_api_errors_are_named_not_just_counted() -> None:
    verdict = judge("memcheck", ERROR_EXIT, API_ERRORS)
    assert not verdict.ok
    assert verdict.summary.startswith(
        'ERROR SUMMARY: 34 errors; first: Program hit CUDA_ERROR_NOT_FOUND (error 500) due to "named symbol not '
        'found" on CUDA API call to cuGetProcAddress_v2.'
    )
    assert verdict.summary.endswith(
        'printed: 34 x Program hit CUDA_ERROR_NOT_FOUND (error 500) due to "named symbol not found" on CUDA API '
        "call to cuGetProcAddress_v2."
    )
    assert "Host Frame" not in verdict.summary


def test_a_long_report_keeps_its_first_errors_and_its_summary() -> None:
    long = "\n".join(f"========= Invalid __global__ read of size 16 bytes #{i}" for i in range(5000))
    long += "\n========= ERROR SUMMARY: 5000 errors\n"
    kept = clip(long, 2000)
    assert kept.startswith("========= Invalid __global__ read of size 16 bytes #0\n")
    assert kept.endswith("ERROR SUMMARY: 5000 errors\n") and "characters left out" in kept
    assert len(kept) < 2100
    assert judge("memcheck", ERROR_EXIT, long).report.startswith(
        "========= Invalid __global__ read of size 16 bytes #0"
    )


def test_a_race_fails_racecheck_even_with_exit_zero() -> None:
    verdict = judge("racecheck", 0, RACECHECK_ERROR)
    assert not verdict.ok and verdict.summary.startswith("RACECHECK SUMMARY: 1 hazard")


def test_a_clean_launch_passes() -> None:
    verdict = judge("initcheck", 0, CLEAN)
    assert verdict.ok and verdict.summary == "ERROR SUMMARY: 0 errors"


def test_a_launch_that_never_happened_is_no_pass() -> None:
    quiet = judge("memcheck", 0, "========= ERROR SUMMARY: 0 errors\n")
    assert not quiet.ok and "did not complete" in quiet.summary
    faulted = judge("memcheck", 3, "probe: the kernel faulted: CUDA error: an illegal memory access\n")
    assert not faulted.ok and "the kernel faulted" in faulted.summary


def test_the_command_runs_the_runtime_launch_under_the_tool() -> None:
    argv = command("/cuda/bin/compute-sanitizer", "racecheck", Path("m.cast"), "k0", python="python3")
    assert argv[:3] == ["/cuda/bin/compute-sanitizer", "--tool", "racecheck"]
    assert argv[argv.index("--error-exitcode") + 1] == str(ERROR_EXIT)
    assert argv[-6:] == ["python3", "-m", "kernelforge_tui.cast.probe", "launch", "m.cast", "k0"]


def test_no_tool_counts_host_api_errors() -> None:
    for tool in SANITIZER_TOOLS:
        argv = command("compute-sanitizer", tool, Path("m.cast"), "k0")
        assert argv[argv.index("--report-api-errors") + 1] == "no", tool


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_a_timeout_ends_the_tool_and_the_program_it_runs() -> None:
    # compute-sanitizer runs the probe as its child: both must go, or the probe keeps the GPU busy.
    child = "import time; time.sleep(60)"
    parent = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); print(p.pid, flush=True); time.sleep(60)"
    )
    started = time.perf_counter()
    code, output, timed_out = run_group([sys.executable, "-c", parent], 2.0, {})
    assert timed_out and code != 0 and time.perf_counter() - started < 30
    grandchild = int(output.split()[0])
    deadline = time.perf_counter() + 5
    while _alive(grandchild) and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
