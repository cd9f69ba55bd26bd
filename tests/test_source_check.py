"""The tree-sitter pass over candidate source: each rule fires on a minimal example, good kernels pass."""

from __future__ import annotations

import pytest

from kernelforge_tui.gpu.source_check import DEFAULT_ALLOWED_INCLUDES, SourceProblem, check_source

GOOD = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda/std/limits>
#include "stdint.h"

namespace cg = cooperative_groups;
#define TILE 32

template <typename T, int N>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = N / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__host__ __device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
static __device__ unsigned lane_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(id));
  return id;
}
constexpr int kRows = 4;

extern "C" __global__ void __launch_bounds__(256)
row_sum(const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float partial[TILE];
  cg::thread_block block = cg::this_thread_block();
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += to_float(x[blockIdx.x * n + i]);
  acc = warp_sum<float, 32>(acc);
  if (lane_id() == 0) partial[threadIdx.x / 32] = acc;
  block.sync();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < blockDim.x / 32; ++w) total += partial[w];
    y[blockIdx.x] = total * kRows / kRows;
  }
}

extern "C" {
__global__ void in_block(float* x) { x[threadIdx.x] = 0.0f; }
}
"""


def rules(problems: list[SourceProblem]) -> list[str]:
    return [p.rule for p in problems if p.severity == "error"]


def test_good_kernel_has_no_errors() -> None:
    assert check_source(GOOD, "row_sum") == []


def test_entry_in_extern_c_block_counts() -> None:
    assert rules(check_source(GOOD, "in_block")) == []


def test_entry_missing_names_the_kernels_found() -> None:
    (problem,) = check_source(GOOD, "softmax")
    assert problem.rule == "entry-missing"
    assert "row_sum" in problem.message and "in_block" in problem.message
    assert 'extern "C" __global__ void softmax' in problem.message


def test_declaration_without_body_is_missing() -> None:
    assert rules(check_source('extern "C" __global__ void k(float* x);', "k")) == ["entry-missing"]


def test_entry_not_global() -> None:
    problems = check_source('extern "C" __device__ void k(float* x) { x[0] = 1.0f; }', "k")
    assert rules(problems) == ["entry-not-global"]
    assert (problems[0].line, problems[0].column) == (1, 12)


def test_entry_not_extern_c() -> None:
    assert rules(check_source("__global__ void k(float* x) { x[0] = 1.0f; }", "k")) == ["entry-not-extern-c"]


def test_template_entry_is_mangled() -> None:
    source = "template <int N> __global__ void k(float* x) { x[0] = N; }"
    assert rules(check_source(source, "k")) == ["entry-not-extern-c"]


@pytest.mark.parametrize(
    "include",
    ["<cuda_runtime.h>", "<cstdio>", '"../secret.h"', "<cuda/std/../../x.h>", "<cub/device/device_reduce.cuh>"],
)
def test_include_not_allowed(include: str) -> None:
    source = f'#include {include}\nextern "C" __global__ void k(float* x) {{}}\n'
    (problem,) = check_source(source, "k")
    assert (problem.rule, problem.line, problem.column) == ("include-not-allowed", 1, 1)
    assert "cuda_bf16.h" in problem.message


def test_custom_allow_list() -> None:
    source = '#include <my_header.h>\nextern "C" __global__ void k(float* x) {}\n'
    assert check_source(source, "k", DEFAULT_ALLOWED_INCLUDES | {"my_header.h"}) == []


def test_host_launch() -> None:
    source = 'extern "C" __global__ void k(float* x) {\n  k<<<1, 32>>>(x);\n}\n'
    (problem,) = check_source(source, "k")
    assert (problem.rule, problem.line, problem.column) == ("host-launch", 2, 4)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        ("cudaMalloc((void**)&x, 4);", "cudaMalloc"),
        ("cudaStreamCreateWithFlags(0, 0);", "cudaStreamCreateWithFlags"),
        ("cudaMemcpyAsync(x, x, 4, cudaMemcpyDeviceToDevice, 0);", "cudaMemcpyAsync"),
        ("cudaGraphLaunch(0, 0);", "cudaGraphLaunch"),
        ("free(x);", "free"),
        ("std::malloc(4);", "malloc"),
        ('system("rm -rf /");', "system"),
        ("float* p = new float[4];", "new"),
    ],
)
def test_forbidden_call(call: str, name: str) -> None:
    source = f'extern "C" __global__ void k(float* x) {{\n  {call}\n}}\n'
    problems = [p for p in check_source(source, "k") if p.severity == "error"]
    assert problems and all(p.rule == "forbidden-call" for p in problems)
    assert problems[0].line == 2 and f"'{name}'" in problems[0].message


def test_forbidden_name_hidden_in_a_macro() -> None:
    source = '#define ALLOC(n) malloc(n)\nextern "C" __global__ void k(float* x) {}\n'
    assert rules(check_source(source, "k")) == ["forbidden-call"]


def test_device_side_launch_dependency_calls_are_allowed() -> None:
    source = 'extern "C" __global__ void k(float* x) { cudaGridDependencySynchronize(); x[0] = 1; }'
    assert check_source(source, "k") == []


def test_placement_new_is_allowed() -> None:
    source = 'extern "C" __global__ void k(float* x) { new (x) float(1.0f); }'
    assert check_source(source, "k") == []


def test_host_only_function_and_main() -> None:
    source = (
        "__host__ void setup() {}\nint main() { return 0; }\n"
        "__host__ __device__ float both(float v) { return v; }\n"
        'extern "C" __global__ void k(float* x) {}\n'
    )
    problems = check_source(source, "k")
    assert [(p.rule, p.line) for p in problems] == [("host-function", 1), ("host-function", 2)]
    assert "'setup'" in problems[0].message


def test_syntax_error_is_a_warning() -> None:
    source = 'extern "C" __global__ void k(float* x) {\n  x[0] = (1.0f;\n}\n'
    problems = check_source(source, "k")
    assert problems and {p.rule for p in problems} == {"syntax-error"}
    assert all(p.severity == "warning" for p in problems)
    assert problems[0].line == 2
