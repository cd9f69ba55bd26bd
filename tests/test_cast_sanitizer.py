"""The sanitizer gate's verdicts, from compute-sanitizer's exit codes and summaries (the runs are on the GPU:
test_cast_gpu.py)."""

from __future__ import annotations

from pathlib import Path

from kernelforge_tui.cast.sanitizer import ERROR_EXIT, command, judge

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


def test_an_error_summary_fails_the_tool() -> None:
    verdict = judge("memcheck", ERROR_EXIT, MEMCHECK_ERROR)
    assert not verdict.ok and verdict.summary == "ERROR SUMMARY: 8 errors"
    assert "Invalid __global__ write" in verdict.report


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
