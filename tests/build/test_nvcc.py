"""The build stage against the real nvcc (CI has nvcc but no GPU): cubins, ptxas stats, diagnostics, cache,
and the guards around nvcc: the sandbox and its limits, kills, size caps, and what is kept of its output.

Fake nvcc scripts (`fake_nvcc`) stand in where the real one cannot misbehave on demand: a build that
would run for minutes, one killed as the OOM killer would kill it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build import nvcc as build_module
from kernelforge_tui.build.nvcc import Builder, detect_arch, find_nvcc, nvcc_version
from kernelforge_tui.build.nvcc_output import OutputCap, candidate_messages
from kernelforge_tui.build.sandbox import (
    Limits,
    SandboxMode,
    SandboxStatus,
    bwrap_command,
    probe,
    read_only_paths,
    sandbox_command,
    sandbox_env,
    sandbox_status,
)
from kernelforge_tui.cards.plan import ResolvedArg

NVCC = find_nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
HOST = sandbox_status()
LIMITS_ONLY = SandboxStatus(mode="limits", reason="test")
ISOLATING: list[SandboxMode] = ["bwrap", "namespaces"]

ADD = """#include <cuda_bf16.h>
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
  __shared__ float tile[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? a[i] : 0.0f;
  __syncthreads();
  if (i < n) c[i] = tile[threadIdx.x] + b[i];
}
"""

BROKEN = """extern "C" __global__ void k(float* x) {
  int i = threadIdx.x;
  x[i] = undeclared_thing;
  float* p = 3.5;
}
"""

SPILLS = """extern "C" __global__ void spill(const float* __restrict__ x, float* y) {
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = x[threadIdx.x + i * 128];
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = acc[i] * acc[(i + k) & 63] + 1.0f;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += acc[i];
  y[threadIdx.x] = s;
}
"""

SLOW = """#include <cub/block/block_reduce.cuh>
extern "C" __global__ void k(float* x) {
  using Reduce = cub::BlockReduce<float, 128>;
  __shared__ typename Reduce::TempStorage storage;
  x[0] = Reduce(storage).Sum(x[threadIdx.x]);
}
"""


def builder(tmp_path: Path, **kwargs: object) -> Builder:
    settings: dict[str, object] = {"arch": "sm_90", "cache_dir": tmp_path / "cache"} | kwargs
    return Builder(**settings)  # type: ignore[arg-type]


def counting_nvcc(tmp_path: Path) -> tuple[str, Path]:
    """A real nvcc behind a script that records each compile, to see whether the cache was used.

    It writes outside its work directory, so builders using it run without file isolation (LIMITS_ONLY).
    """
    assert NVCC is not None
    calls = tmp_path / "calls.txt"
    script = tmp_path / "bin" / "nvcc"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\ncase "$1" in -cubin) echo x >> "{calls}";; esac\nexec "{NVCC}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), calls


def compiles(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


def test_nvcc_version() -> None:
    assert NVCC is not None
    assert re.fullmatch(r"\d+\.\d+\.\d+", nvcc_version(NVCC))


async def test_build_makes_a_cubin_with_ptxas_stats(tmp_path: Path) -> None:
    result = await builder(tmp_path).build(ADD, "add")
    assert result.ok and result.failure is None and not result.cached
    assert result.cubin_path is not None and result.cubin_path.read_bytes()[:4] == b"\x7fELF"
    stats = result.ptxas["add"]
    assert stats.registers > 0 and stats.shared_bytes == 1024 and stats.barriers == 1
    assert stats.spill_store_bytes == 0
    assert "ptxas info" in result.log


async def test_second_build_is_a_cache_hit(tmp_path: Path) -> None:
    first = await builder(tmp_path).build(ADD, "add")
    second = await builder(tmp_path).build(ADD, "add")  # a new Builder: the cache is on disk
    assert second.cached and second.ok and second.key == first.key
    assert second.seconds < first.seconds
    assert second.ptxas == first.ptxas and second.cubin_path == first.cubin_path


async def test_flags_arch_and_entry_change_the_key(tmp_path: Path) -> None:
    assert NVCC is not None
    version = nvcc_version(NVCC)
    base = builder(tmp_path).cache_key(ADD, "add", "sm_90", version)
    assert builder(tmp_path, flags=["-O2"]).cache_key(ADD, "add", "sm_90", version) != base
    assert builder(tmp_path).cache_key(ADD, "add2", "sm_90", version) != base
    assert builder(tmp_path).cache_key(ADD + " ", "add", "sm_90", version) != base
    sm80 = await builder(tmp_path, arch="sm_80").build(ADD, "add")
    assert sm80.ok and not sm80.cached and sm80.key != base


async def test_compile_errors_carry_line_column_and_text(tmp_path: Path) -> None:
    result = await builder(tmp_path).build(BROKEN, "k")
    assert not result.ok and result.failure == "compile error" and result.cubin_path is None
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert [(d.file, d.line, d.column) for d in errors] == [("candidate.cu", 3, 10), ("candidate.cu", 4, 14)]
    assert 'identifier "undeclared_thing" is undefined' in errors[0].message
    assert errors[0].source_line == "  x[i] = undeclared_thing;"
    assert 'type "double"' in errors[1].message


async def test_warnings_do_not_fail_a_build(tmp_path: Path) -> None:
    source = 'extern "C" __global__ void k(float* x) {\n  int unused = 3;\n  x[0] = 1.0f;\n}\n'
    result = await builder(tmp_path).build(source, "k")
    assert result.ok
    (warning,) = result.diagnostics
    assert (warning.severity, warning.line, warning.column) == ("warning", 2, 7)
    assert 'variable "unused" was declared but never referenced' in warning.message


async def test_preprocessor_error_has_a_column(tmp_path: Path) -> None:
    source = 'extern "C" __global__ void k(float* x) {}\n #error stop here\n'
    result = await builder(tmp_path).build(source, "k")
    (error,) = result.diagnostics
    assert (error.line, error.column, error.message) == (2, 3, "#error stop here")


async def test_column_maps_through_macro_expansion(tmp_path: Path) -> None:
    # nvcc echoes the preprocessed line (`__device__` becomes `__attribute__((device))`).
    source = (
        "template <typename T> __device__ T h(T v) { return v.foo; }\n"
        'extern "C" __global__ void k(float* x) { x[0] = h(x[1]); }\n'
    )
    result = await builder(tmp_path).build(source, "k")
    (error,) = result.diagnostics
    assert (error.line, error.column) == (1, 52)
    assert "class type" in error.message and "instantiation" in error.message


async def test_ptxas_errors_have_no_line(tmp_path: Path) -> None:
    source = 'extern "C" __global__ void k(float* x) {\n  __shared__ float s[100000];\n'
    source += "  s[threadIdx.x] = x[0];\n  __syncthreads();\n  x[threadIdx.x] = s[threadIdx.x + 1];\n}\n"
    result = await builder(tmp_path).build(source, "k")
    assert result.failure == "compile error"
    error = result.diagnostics[0]
    assert error.file == "ptxas" and error.line is None and "too much shared data" in error.message


async def test_spills_and_stack_are_reported(tmp_path: Path) -> None:
    result = await builder(tmp_path, flags=["-O3", "-maxrregcount=24"]).build(SPILLS, "spill")
    stats = result.ptxas["spill"]
    assert result.ok and stats.registers <= 24
    assert stats.spill_store_bytes > 0 and stats.spill_load_bytes > 0 and stats.stack_frame_bytes > 0


def fake_nvcc(tmp_path: Path, body: str) -> str:
    """A script that answers `--version` like the real nvcc (so cache keys match) and runs `body` to build."""
    assert NVCC is not None
    script = tmp_path / "fake" / "bin" / "nvcc"
    script.parent.mkdir(parents=True)
    version = f"Cuda compilation tools, release 13.0, V{nvcc_version(NVCC)}"
    script.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version}"; exit 0; fi\n{body}\n')
    script.chmod(0o755)
    return str(script)


def write_real_cubin(tmp_path: Path) -> str:
    """Shell that writes a real cubin to kernel.cubin, for fake nvccs to start theirs with (a build refuses a file
    that is not ELF; a sandbox may hide `tmp_path`); what they append after it stays in the file for the test."""
    assert NVCC is not None
    target = tmp_path / "real" / "kernel.cubin"
    target.parent.mkdir()
    (target.parent / "add.cu").write_text(ADD)
    subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-o", str(target), "add.cu"], cwd=target.parent, check=True)
    return f"echo {base64.b64encode(target.read_bytes()).decode()} | base64 -d > kernel.cubin"


def sleeper(tmp_path: Path) -> tuple[str, str]:
    """A fake nvcc that would run for ten minutes with a child of its own, and the marker in the child's argv."""
    marker = f"kf-sleeper-{tmp_path}"  # unique to this run
    return fake_nvcc(tmp_path, f"sh -c 'sleep 600; : {marker}' &\nsleep 600"), marker


def stat_fields(pid: str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, pgrp, ..."""
    return Path("/proc", pid, "stat").read_text().rsplit(")", 1)[1].split()


async def groups_running(marker: str) -> set[int]:
    """Process groups of the processes whose argv mentions `marker`, once they exist (10 s at most)."""
    for _ in range(500):
        pids = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]
        groups = set()
        for pid in pids:
            try:
                if marker in (Path("/proc", pid, "cmdline")).read_text(errors="replace"):
                    groups.add(int(stat_fields(pid)[2]))
            except OSError:
                continue
        if groups:
            return groups
        await asyncio.sleep(0.02)
    raise AssertionError(f"no process mentions {marker}")


def alive_in(groups: set[int]) -> list[str]:
    """Live (not zombie) processes in any of `groups`, after the second SIGKILL needs to take effect."""
    for _ in range(100):
        alive = []
        for proc in Path("/proc").iterdir():
            try:
                fields = stat_fields(proc.name) if proc.name.isdigit() else None
            except OSError:
                continue
            if fields is not None and int(fields[2]) in groups and fields[0] != "Z":
                alive.append(f"{proc.name} {fields[0]} {(proc / 'cmdline').read_bytes()!r}")
        if not alive:
            break
        time.sleep(0.01)
    return alive


def modes() -> list[SandboxStatus]:
    """The limits-only mode (always there) and the machine's isolating mode, if any."""
    return [LIMITS_ONLY] + ([HOST] if HOST.mode != "limits" else [])


@pytest.mark.parametrize("sandbox", modes(), ids=lambda s: s.mode)
async def test_timeout_kills_the_whole_nvcc_group_and_is_not_cached(tmp_path: Path, sandbox: SandboxStatus) -> None:
    nvcc, marker = sleeper(tmp_path)
    work = tmp_path / "work"
    slow = builder(tmp_path, nvcc=nvcc, timeout_s=2.0, work_dir=work, sandbox=sandbox)
    task = asyncio.create_task(slow.build(ADD, "add"))
    groups = await groups_running(marker)
    result = await asyncio.wait_for(task, 30)  # without the kill, nvcc's wait would take ten minutes
    assert not result.ok and result.failure == "timeout" and "2 s" in result.diagnostics[0].message
    assert alive_in(groups) == [] and processes_mentioning(marker) == []
    assert list(work.iterdir()) == []
    assert not (tmp_path / "cache" / f"{result.key}.json").exists()
    retry = await builder(tmp_path).build(ADD, "add")  # the real nvcc, same key
    assert retry.ok and not retry.cached and retry.key == result.key


@pytest.mark.parametrize("sandbox", modes(), ids=lambda s: s.mode)
async def test_cancelled_build_leaves_no_nvcc(tmp_path: Path, sandbox: SandboxStatus) -> None:
    nvcc, marker = sleeper(tmp_path)
    work = tmp_path / "work"
    task = asyncio.create_task(builder(tmp_path, nvcc=nvcc, work_dir=work, sandbox=sandbox).build(ADD, "add"))
    groups = await groups_running(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert alive_in(groups) == [] and processes_mentioning(marker) == []
    assert list(work.iterdir()) == []


async def test_a_build_cancelled_while_nvcc_starts_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while asyncio still connects nvcc's pipes (seen under load): nvcc and its children already run."""
    real_spawn = asyncio.create_subprocess_exec

    async def slow_to_connect(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await real_spawn(*args, **kwargs)
        await asyncio.sleep(0.5)  # the window: the process runs, the caller has no handle on it yet
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_to_connect)
    nvcc, marker = sleeper(tmp_path)
    task = asyncio.create_task(builder(tmp_path, nvcc=nvcc, sandbox=LIMITS_ONLY).build(ADD, "add"))
    groups = await groups_running(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert alive_in(groups) == [] and processes_mentioning(marker) == []


async def test_a_build_cancelled_as_nvcc_ends_is_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled in the moment between nvcc's output being read and the build resuming (as a search's end cancels
    its build workers): Python 3.11's `asyncio.wait_for` swallowed such a cancel, and the worker went on waiting
    for work that never came, so the search never ended (a resumed time-capped run hung in CI)."""
    real_read = build_module._read_bounded
    read, gate = asyncio.Event(), asyncio.get_running_loop().create_future()

    async def gated(proc: asyncio.subprocess.Process, cap: OutputCap) -> None:
        await real_read(proc, cap)
        read.set()
        await gate

    monkeypatch.setattr(build_module, "_read_bounded", gated)
    nvcc = fake_nvcc(tmp_path, "exit 1")
    task = asyncio.create_task(builder(tmp_path, nvcc=nvcc, sandbox=LIMITS_ONLY).build(ADD, "add"))
    await asyncio.wait_for(read.wait(), 30)
    gate.set_result(None)  # nvcc's output is in; the build resumes at the next turn of the loop, cancelled
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("sandbox", modes(), ids=lambda s: s.mode)
async def test_nvcc_killed_by_a_signal_is_not_cached(tmp_path: Path, sandbox: SandboxStatus) -> None:
    """As the OOM killer would: SIGKILL to nvcc itself. The next request builds again."""
    nvcc, marker = sleeper(tmp_path)
    task = asyncio.create_task(builder(tmp_path, nvcc=nvcc, sandbox=sandbox).build(ADD, "add"))
    await groups_running(marker)
    (victim,) = processes_running(nvcc)
    os.kill(victim, signal.SIGKILL)
    result = await asyncio.wait_for(task, 30)
    assert result.failure == "killed" and "SIGKILL" in result.diagnostics[0].message
    assert "out of memory" in result.diagnostics[0].message
    assert not (tmp_path / "cache" / f"{result.key}.json").exists()
    retry = await builder(tmp_path).build(ADD, "add")
    assert retry.ok and not retry.cached


async def test_a_tool_nvcc_says_died_is_not_cached(tmp_path: Path) -> None:
    nvcc = fake_nvcc(tmp_path, "echo \"nvcc error   : 'cicc' died due to signal 9 (Kill signal)\"\nexit 255")
    result = await builder(tmp_path, nvcc=nvcc).build(ADD, "add")
    assert result.failure == "killed" and "SIGKILL" in result.log
    assert not (tmp_path / "cache" / f"{result.key}.json").exists()


def processes_running(script: str) -> list[int]:
    """Pids whose argv runs `script` (a fake nvcc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if script.encode() in argv[:2]:
            pids.append(int(proc.name))
    return pids


async def test_failed_build_is_cached_and_not_recompiled(tmp_path: Path) -> None:
    nvcc, calls = counting_nvcc(tmp_path)
    first = await builder(tmp_path, nvcc=nvcc, sandbox=LIMITS_ONLY).build(BROKEN, "k")
    second = await builder(tmp_path, nvcc=nvcc, sandbox=LIMITS_ONLY).build(BROKEN, "k")
    assert first.failure == second.failure == "compile error"
    assert second.cached and second.diagnostics == first.diagnostics
    assert compiles(calls) == 1


async def test_concurrent_identical_builds_compile_once(tmp_path: Path) -> None:
    nvcc, calls = counting_nvcc(tmp_path)
    build = builder(tmp_path, nvcc=nvcc, max_parallel=2, sandbox=LIMITS_ONLY)
    results = await asyncio.gather(*(build.build(ADD, "add") for _ in range(3)))
    assert all(r.ok for r in results) and sum(not r.cached for r in results) == 1
    assert compiles(calls) == 1


async def test_source_check_runs_before_nvcc(tmp_path: Path) -> None:
    nvcc, calls = counting_nvcc(tmp_path)
    source = 'extern "C" __global__ void k(float* x) {\n  k<<<1, 1>>>(x);\n}\n'
    result = await builder(tmp_path, nvcc=nvcc, sandbox=LIMITS_ONLY).build(source, "k")
    assert result.failure == "source check" and compiles(calls) == 0
    (problem,) = result.diagnostics
    assert (problem.line, problem.column) == (2, 4) and "host-launch" in problem.message


async def test_missing_nvcc_is_a_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = await builder(tmp_path, nvcc=str(tmp_path / "no-such-nvcc")).build(ADD, "add")
    assert result.failure == "nvcc missing" and "CUDA toolkit" in result.diagnostics[0].message
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert (await builder(tmp_path).build(ADD, "add")).failure == "nvcc missing"


def test_detect_arch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_arch() is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, GPU-1234, 9.0, 580.159.04, 143771'\n")
    smi.chmod(0o755)
    assert detect_arch() == "sm_90"


async def test_configured_arch_wins(tmp_path: Path) -> None:
    assert await builder(tmp_path, arch="sm_86").arch() == "sm_86"


@pytest.mark.parametrize(
    ("source", "says"),
    [
        (ADD + "// " + "x" * (1 << 20), "the cap is 1048576 bytes"),
        (ADD + "\0", "NUL character"),
        (ADD + "// \udcff", "undecodable"),
        ('#include_next "/etc/passwd"\n' + ADD, "#include_next is not allowed"),
    ],
    ids=["too large", "NUL", "undecodable", "directive"],
)
async def test_unreadable_sources_fail_before_nvcc(tmp_path: Path, source: str, says: str) -> None:
    nvcc, calls = counting_nvcc(tmp_path)
    result = await builder(tmp_path, nvcc=nvcc, sandbox=LIMITS_ONLY).build(source, "add")
    assert result.failure == "source check" and says in result.diagnostics[0].message
    assert compiles(calls) == 0


async def test_sources_are_checked_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checked_in: list[threading.Thread] = []

    def slow_check(*args: object) -> list[object]:
        checked_in.append(threading.current_thread())
        time.sleep(0.3)  # a 10 MB source takes a while: the loop must go on meanwhile
        return []

    monkeypatch.setattr(build_module, "check_source", slow_check)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await builder(tmp_path).build(ADD, "add")
    ticker.cancel()
    assert checked_in and checked_in[0] is not threading.main_thread()
    assert ticks >= 10


async def test_plan_arguments_are_checked_before_nvcc(tmp_path: Path) -> None:
    nvcc, calls = counting_nvcc(tmp_path)
    args = [ResolvedArg(kind="tensor", name=n) for n in "abc"] + [
        ResolvedArg(kind="scalar", name="n", scalar_type="int64")
    ]
    result = await builder(tmp_path, nvcc=nvcc, sandbox=LIMITS_ONLY).build(ADD, "add", args)
    assert result.failure == "source check" and compiles(calls) == 0
    (problem,) = result.diagnostics
    assert "parameter 4 'n' (int n) receives 'n' as int64, but it is int32" in problem.message
    assert (problem.line, problem.column) == (2, ADD.splitlines()[1].index("int n") + 1)
    args[3] = ResolvedArg(kind="scalar", name="n", scalar_type="int32")
    assert (await builder(tmp_path).build(ADD, "add", args)).ok


async def test_a_cubin_over_the_cap_is_refused(tmp_path: Path) -> None:
    result = await builder(tmp_path, max_cubin_bytes=1000).build(ADD, "add")
    assert not result.ok and result.failure == "compile error" and result.cubin_path is None
    assert "over the cap of 1000 bytes" in result.diagnostics[-1].message
    assert (await builder(tmp_path).build(ADD, "add")).ok  # the cap is part of the key


# nvcc 13's output for `#include "/etc/hostname"` (the file holds "vm"), before the source check refused it.
LEAKED = """/etc/hostname(1): error: this declaration has no storage class or type specifier
  vm
  ^

candidate.cu(3): error: expected a ";"
  extern "C" __attribute__((global)) void k(float* x) {}
  ^

In file included from candidate.cu:1:
/etc/hostname:1:1: error: 'vm' does not name a type
    1 | vm
      | ^~
Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

2 errors detected in the compilation of "candidate.cu".
"""


def test_only_messages_about_the_candidate_are_kept() -> None:
    kept = candidate_messages(LEAKED)
    assert "vm" not in kept and "hostname" not in kept and "Remark" not in kept
    assert kept.splitlines() == [
        "kernelforge withheld: error in another file",
        'candidate.cu(3): error: expected a ";"',
        '  extern "C" __attribute__((global)) void k(float* x) {}',
        "  ^",
        "",
        "kernelforge withheld: error in another file",
        '2 errors detected in the compilation of "candidate.cu".',
    ]


async def test_header_errors_are_withheld_but_placed(tmp_path: Path) -> None:
    """A static_assert fails inside a toolkit header: the message says so, at the candidate's line, no header text."""
    source = (
        "#include <cuda/std/array>\n"
        'extern "C" __global__ void k(float* x) {\n'
        "  cuda::std::array<float, 2> a{1.0f, 2.0f};\n"
        "  x[0] = cuda::std::get<5>(a);\n"
        "}\n"
    )
    result = await builder(tmp_path).build(source, "k")
    assert result.failure == "compile error"
    (error,) = [d for d in result.diagnostics if d.severity == "error"]
    assert (error.file, error.line) == ("candidate.cu", 4) and "withheld" in error.message
    stored = result.model_dump_json()
    assert "static_assert" not in stored and "Index out of bounds" not in stored and "cccl" not in stored


async def test_nvcc_gets_a_scrubbed_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_SECRET_TOKEN", "hunter2")
    nvcc = fake_nvcc(tmp_path, f"{write_real_cubin(tmp_path)}; env >> kernel.cubin")  # the environment nvcc saw
    result = await builder(tmp_path, nvcc=nvcc).build(ADD, "add")
    assert result.ok and result.cubin_path is not None
    seen = result.cubin_path.read_bytes().decode(errors="replace")
    assert "hunter2" not in seen and "TMPDIR=" in seen


def test_bwrap_command_binds_the_toolkit_and_the_work_dir_only(tmp_path: Path) -> None:
    assert NVCC is not None
    work = tmp_path / "work"
    argv = bwrap_command("/usr/bin/bwrap", ["nvcc", "-cubin"], work, read_only_paths(NVCC))
    assert argv[0] == "/usr/bin/bwrap" and argv[-3:] == ["--", "nvcc", "-cubin"]
    for flag in ("--unshare-all", "--die-with-parent"):
        assert flag in argv
    binds = {argv[i + 1]: argv[i] for i, a in enumerate(argv) if a in ("--ro-bind", "--bind", "--symlink")}
    assert binds[str(work)] == "--bind" and binds["/usr"] == "--ro-bind"
    assert all(kind != "--bind" for path, kind in binds.items() if path != str(work))
    toolkit = Path(NVCC).resolve().parent.parent
    assert any(toolkit == Path(p) or Path(p) in toolkit.parents for p in binds)
    assert not {"/", "/home", "/root", "/etc", "/tmp", str(tmp_path)} & set(binds)
    assert argv.index("--tmpfs") < argv.index("--bind")  # /tmp first, so a work dir under it stays visible


def in_sandbox(tmp_path: Path, status: SandboxStatus, script: str) -> subprocess.CompletedProcess[str]:
    work, scratch = tmp_path / "work", tmp_path / "root"
    work.mkdir(exist_ok=True)
    scratch.mkdir(exist_ok=True)
    argv = sandbox_command(["/bin/sh", "-c", script], work, scratch, read_only_paths("/bin/sh"), status)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=sandbox_env("/bin/sh", work))


def isolating(mode: SandboxMode) -> SandboxStatus:
    """The mode, or a skip saying why this machine lacks it (bubblewrap is optional: CI may not have it)."""
    bwrap = shutil.which("bwrap")
    failed = probe(mode, bwrap) if mode == "namespaces" or bwrap else "bubblewrap (bwrap) is not on PATH"
    if failed is not None:
        pytest.skip(f"{mode} does not work on this machine: {failed}")
    return SandboxStatus(mode=mode, reason="test", bwrap=bwrap)


@pytest.mark.parametrize("mode", ISOLATING)
def test_isolated_nvcc_sees_no_host_files(tmp_path: Path, mode: SandboxMode) -> None:
    status = isolating(mode)
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    probe = Path(f"/usr/kf-probe-{os.getpid()}")
    try:
        done = in_sandbox(
            tmp_path,
            status,
            f"cat {secret}; ls /root /home /etc/hostname; echo x > {probe}; echo ok > {tmp_path}/work/out; "
            "ls /usr/bin/gcc",
        )
        assert not probe.exists()
    finally:
        probe.unlink(missing_ok=True)
    assert "hunter2" not in done.stdout
    assert "No such file" in done.stderr and "Read-only file system" in done.stderr
    assert (tmp_path / "work" / "out").read_text() == "ok\n"
    assert "/usr/bin/gcc" in done.stdout


@pytest.mark.parametrize("mode", ISOLATING)
async def test_real_build_through_each_isolating_mode(tmp_path: Path, mode: SandboxMode) -> None:
    result = await builder(tmp_path, sandbox=isolating(mode)).build(ADD, "add")
    assert result.ok and result.ptxas["add"].registers > 0, result.log


@pytest.mark.parametrize("mode", ISOLATING)
async def test_the_builder_runs_nvcc_isolated(tmp_path: Path, mode: SandboxMode) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    real = write_real_cubin(tmp_path)
    nvcc = fake_nvcc(tmp_path, f"{real}; (cat {secret}; ls /root) >> kernel.cubin 2>&1\nexit 0")  # what it reads
    result = await builder(tmp_path, nvcc=nvcc, sandbox=isolating(mode)).build(ADD, "add")
    assert result.ok and result.cubin_path is not None
    seen = result.cubin_path.read_bytes().decode(errors="replace")
    assert "hunter2" not in seen and "No such file" in seen


@pytest.mark.parametrize(
    ("limits", "script", "signalled"),
    [
        (Limits(address_space_bytes=256 << 20), f"exec {sys.executable} -c 'bytearray(300 << 20)'", False),
        (Limits(file_bytes=1 << 20), "exec head -c 2000000 /dev/zero > big", True),
        (Limits(cpu_seconds=1), "while :; do :; done", True),
    ],
    ids=["address space", "file size", "cpu time"],
)
def test_limits_stop_a_runaway_build(tmp_path: Path, limits: Limits, script: str, signalled: bool) -> None:
    done = in_sandbox(tmp_path, SandboxStatus(mode="limits", reason="test", limits=limits), script)
    assert done.returncode < 0 if signalled else done.returncode != 0, (done.returncode, done.stderr)


def _my_processes() -> int:
    """This user's processes now (one that ends while /proc is read is not counted)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError):
                count += entry.stat().st_uid == os.getuid()
    return count


def test_the_process_limit_is_set(tmp_path: Path) -> None:
    running = _my_processes()
    done = in_sandbox(tmp_path, LIMITS_ONLY, "cat /proc/self/limits")
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("Max processes")]
    soft, hard = line.split()[2:4]
    assert soft == hard and running < int(soft) < running + LIMITS_ONLY.limits.processes + 50


def test_sandbox_status_says_what_protects_the_host() -> None:
    status = sandbox_status()
    assert status.mode in ("bwrap", "namespaces", "limits")
    assert "\n" not in status.description and status.description.startswith("nvcc sandbox: ")
    assert status.model_dump()["description"] == status.description  # shown by `doctor --json` as well
    if status.mode == "limits":
        assert "NO file isolation" in status.description and "Fix:" in status.description


def flood(copies: int) -> str:
    """The issue's kernel: `copies` division-by-zero blocks on one line; EDG warns per copy, echoing the line."""
    return 'extern "C" __global__ void k(float* o) {' + "{int z=1/0;}" * copies + "}\n"


async def test_a_diagnostic_flood_is_stopped_and_refused(tmp_path: Path) -> None:
    capped = builder(tmp_path, max_log_bytes=4096, max_diagnostics=20)
    result = await capped.build(flood(1 << 7), "k")  # ~600 KB of warnings from nvcc
    assert not result.ok and result.failure == "compile error"
    assert "diagnostics overflowed: more than 20 messages or 4096 bytes" in result.diagnostics[0].message
    assert len(result.log) < 4096 + 600 and len(result.diagnostics) <= 22
    assert any(d.severity == "warning" and "division by zero" in d.message for d in result.diagnostics)
    entry = tmp_path / "cache" / f"{result.key}.json"
    assert entry.stat().st_size < 32 << 10
    again = await capped.build(flood(1 << 7), "k")
    assert again.cached and again.diagnostics == result.diagnostics


async def test_a_flooding_nvcc_is_killed_at_once(tmp_path: Path) -> None:
    """Output without end from nvcc and a child of its own: stopped at the cap, not at the 60 s timeout."""
    marker = f"kf-flooder-{tmp_path}"
    line = "candidate.cu(1): warning #39-D: division by zero"
    nvcc = fake_nvcc(tmp_path, f"sh -c 'sleep 600; : {marker}' &\nsleep 1\nwhile :; do echo '{line}'; echo '  x'; done")
    flooded = builder(tmp_path, nvcc=nvcc, max_log_bytes=2048, max_diagnostics=10, sandbox=LIMITS_ONLY)
    task = asyncio.create_task(flooded.build(ADD, "add"))
    groups = await groups_running(marker)
    result = await asyncio.wait_for(task, 30)
    assert result.failure == "compile error" and "overflowed" in result.diagnostics[0].message
    assert alive_in(groups) == [] and processes_mentioning(marker) == []


async def test_an_oversized_cache_entry_is_a_miss(tmp_path: Path) -> None:
    """An entry bigger than any this builder writes (an older kernelforge's flood): built again, not replayed."""
    assert NVCC is not None
    capped = builder(tmp_path, max_log_bytes=4096, max_diagnostics=20)
    key = capped.cache_key(ADD, "add", "sm_90", nvcc_version(NVCC))
    huge = build_module.BuildResult(ok=False, key=key, failure="compile error", log="w" * (4 << 20))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / f"{key}.json").write_text(huge.model_dump_json())
    result = await capped.build(ADD, "add")
    assert result.ok and not result.cached and len(result.log) < 4096


HEAP_CALLS = [
    "void* p = __nv_aligned_device_malloc(64, 16); o[0] = p != 0;",
    "void* p = __builtin_malloc(32); o[0] = p != 0;",
    "float* p = new float[4]; p[0] = 1.0f; o[0] = p[0]; delete[] p;",
]


@pytest.mark.parametrize("body", HEAP_CALLS, ids=["aligned", "builtin", "new"])
async def test_device_heap_calls_are_refused_from_the_cubin(
    tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source check lists these spellings; the cubin check holds for one it would miss (the check is off)."""
    monkeypatch.setattr(build_module, "check_source", lambda *args: [])
    result = await builder(tmp_path).build(f'extern "C" __global__ void k(float* o) {{ {body} }}\n', "k")
    assert not result.ok and result.failure == "compile error" and result.cubin_path is None
    assert "calls the device heap" in result.diagnostics[-1].message and "malloc" in result.diagnostics[-1].message


async def test_huge_device_globals_are_refused(tmp_path: Path) -> None:
    big = '__device__ float big[1 << 30];\nextern "C" __global__ void k(float* o) { o[0] = big[threadIdx.x]; }\n'
    result = await builder(tmp_path).build(big, "k")
    assert not result.ok and result.failure == "compile error"
    assert "__device__ globals take 4294967296 bytes, over the cap of 67108864" in result.diagnostics[-1].message
    small = big.replace("1 << 30", "16")
    assert (await builder(tmp_path).build(small, "k")).ok
    refused = await builder(tmp_path, max_global_bytes=32).build(small, "k")
    assert not refused.ok and "take 64 bytes, over the cap of 32" in refused.diagnostics[-1].message


async def test_ptxas_messages_carry_no_host_path(tmp_path: Path) -> None:
    source = 'extern "C" __global__ void k(float* o) { asm volatile("mov.u32 %r99, 1;"); }\n'
    result = await builder(tmp_path, work_dir=tmp_path / "work").build(source, "k")
    assert not result.ok and result.failure == "compile error"
    texts = [result.log, *(d.message for d in result.diagnostics)]
    assert not any("kernelforge-build" in t or str(tmp_path) in t or "tmpxft" in t for t in texts), texts
    assert "ptxas candidate.ptx, line " in result.log


KILLED_PARENT = """
import asyncio, sys
from pathlib import Path
from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.sandbox import SandboxStatus
nvcc, root, sandbox = sys.argv[1], Path(sys.argv[2]), SandboxStatus.model_validate_json(sys.argv[3])
built = Builder(nvcc=nvcc, arch="sm_90", cache_dir=root / "cache", work_dir=root / "work", sandbox=sandbox)
asyncio.run(built.build(sys.argv[4], "add"))
"""


@pytest.mark.parametrize("sandbox", modes(), ids=lambda s: s.mode)
async def test_kill_9_of_the_search_takes_nvcc_along_and_its_dir_is_swept(
    tmp_path: Path, sandbox: SandboxStatus
) -> None:
    nvcc, marker = sleeper(tmp_path)
    argv = [sys.executable, "-c", KILLED_PARENT, nvcc, str(tmp_path), sandbox.model_dump_json(), ADD]
    parent = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[2])
    try:
        groups = await groups_running(marker)
    finally:
        parent.kill()  # SIGKILL: no handler, no finally runs in the parent
        parent.wait()
    for _ in range(500):
        if not processes_mentioning(marker) and not processes_mentioning(nvcc):
            break
        await asyncio.sleep(0.02)
    assert alive_in(groups) == [] and processes_mentioning(marker) == [] and processes_mentioning(nvcc) == []
    work = tmp_path / "work"
    (stale,) = work.iterdir()
    assert stale.name.startswith(f"kernelforge-build-{parent.pid}-")
    live, unnamed = work / f"kernelforge-build-{os.getpid()}-live", work / "kernelforge-build-abc"
    live.mkdir()
    unnamed.mkdir()
    assert (await builder(tmp_path, work_dir=work).build(ADD, "add")).ok
    assert set(work.iterdir()) == {unnamed, live}
