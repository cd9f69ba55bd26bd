"""The build stage against the real nvcc (CI has nvcc but no GPU): cubins, ptxas stats, diagnostics, cache."""

from __future__ import annotations

import asyncio
import re
import stat
from pathlib import Path

import pytest

from kernelforge_tui.gpu.build import Builder, detect_arch, find_nvcc, nvcc_version

NVCC = find_nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")

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
    """A real nvcc behind a script that records each compile, to see whether the cache was used."""
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


async def test_timeout_kills_nvcc_and_is_not_cached(tmp_path: Path) -> None:
    work = tmp_path / "work"
    slow = builder(tmp_path, timeout_s=0.001, work_dir=work)
    result = await slow.build(ADD, "add")
    assert not result.ok and result.failure == "timeout" and "0.001" in result.diagnostics[0].message
    assert processes_mentioning(str(work)) == []
    assert list(work.iterdir()) == []
    retry = await builder(tmp_path).build(ADD, "add")
    assert retry.ok and not retry.cached


async def test_cancelled_build_leaves_no_nvcc(tmp_path: Path) -> None:
    work = tmp_path / "work"
    task = asyncio.create_task(builder(tmp_path, work_dir=work).build(SLOW, "k"))
    for _ in range(100):  # wait until nvcc runs
        await asyncio.sleep(0.02)
        if processes_mentioning(str(work)):
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert processes_mentioning(str(work)) == []
    assert list(work.iterdir()) == []


async def test_failed_build_is_cached_and_not_recompiled(tmp_path: Path) -> None:
    nvcc, calls = counting_nvcc(tmp_path)
    first = await builder(tmp_path, nvcc=nvcc).build(BROKEN, "k")
    second = await builder(tmp_path, nvcc=nvcc).build(BROKEN, "k")
    assert first.failure == second.failure == "compile error"
    assert second.cached and second.diagnostics == first.diagnostics
    assert compiles(calls) == 1


async def test_concurrent_identical_builds_compile_once(tmp_path: Path) -> None:
    nvcc, calls = counting_nvcc(tmp_path)
    build = builder(tmp_path, nvcc=nvcc, max_parallel=2)
    results = await asyncio.gather(*(build.build(ADD, "add") for _ in range(3)))
    assert all(r.ok for r in results) and sum(not r.cached for r in results) == 1
    assert compiles(calls) == 1


async def test_source_check_runs_before_nvcc(tmp_path: Path) -> None:
    nvcc, calls = counting_nvcc(tmp_path)
    source = 'extern "C" __global__ void k(float* x) {\n  k<<<1, 1>>>(x);\n}\n'
    result = await builder(tmp_path, nvcc=nvcc).build(source, "k")
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
