"""The source check: each rule fires on a minimal example, with its place; every honest kernel passes.

The directive guard is tested with the ways to hide a directive or a name from a raw-text check (the
probe of issue 9): each must be refused at the line and column where it starts.
"""

from __future__ import annotations

import re

import pytest

from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.build.source_policy import DEFAULT_ALLOWED_INCLUDES
from kernelforge_tui.build.source_problem import SourceProblem
from kernelforge_tui.cards import load_card, resolve
from kernelforge_tui.cards.plan import ResolvedArg, load_plan
from tests.conftest import EXAMPLES
from tests.proposers.templates.test_templates import all_cards, render, sample

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
        ("void* p = __nv_aligned_device_malloc(64, 16);", "__nv_aligned_device_malloc"),
        ("void* p = __builtin_malloc(32);", "__builtin_malloc"),
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


KERNEL = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'


def errors(source: str, entry: str = "k") -> list[tuple[int, int, str, str]]:
    return [(p.line, p.column, p.rule, p.message) for p in check_source(source, entry) if p.severity == "error"]


@pytest.mark.parametrize(
    ("source", "line", "column", "rule", "says"),
    [
        ('#include_next "/etc/passwd"\n' + KERNEL, 1, 1, "directive-not-allowed", "#include_next is not allowed"),
        ('#import "/some/secret.txt"\n' + KERNEL, 1, 1, "directive-not-allowed", "#import is not allowed"),
        ('#inc\\\nlude "/etc/passwd"\n' + KERNEL, 1, 1, "include-not-allowed", '#include "/etc/passwd"'),
        # gcc splices a backslash and a newline with blanks between them too.
        ('#inc\\  \nlude "/etc/passwd"\n' + KERNEL, 1, 1, "include-not-allowed", '#include "/etc/passwd"'),
        ('%:include "/etc/passwd"\n' + KERNEL, 1, 1, "include-not-allowed", '#include "/etc/passwd"'),
        ('#if __has_include("/root/.ssh/id_rsa")\n#endif\n' + KERNEL, 1, 5, "directive-not-allowed", "__has_include"),
        ("#define P __has_include_next\n" + KERNEL, 1, 11, "directive-not-allowed", "__has_include_next"),
        ('#if __has_include__("/etc/passwd")\n#endif\n' + KERNEL, 1, 5, "directive-not-allowed", "__has_include__"),
        ('#pragma GCC dependency "/etc/passwd"\n' + KERNEL, 1, 1, "directive-not-allowed", "#pragma GCC dependency"),
        ("#pragma push_macro(\"X\")\n" + KERNEL, 1, 1, "directive-not-allowed", "#pragma push_macro"),
        ('#line 1 "/etc/passwd"\n' + KERNEL, 1, 1, "directive-not-allowed", "#line is not allowed"),
        ('# 1 "/etc/passwd"\n' + KERNEL, 1, 1, "directive-not-allowed", "line marker"),
        ('#define CAT(a,b) a##b\nextern "C" __global__ void k(float* x) { CAT(mal,loc)(8); }\n', 1, 19,
         "token-paste", "token pasting"),
        ("#define CAT(a,b) a%:%:b\n" + KERNEL, 1, 19, "token-paste", "token pasting"),
        ('extern "C" __global__ void k(float* x) {\n  mal\\\nloc(8);\n}\n', 2, 3, "forbidden-call", "'malloc'"),
        ('extern "C" __global__ void k(float* x) { void* p = operator new(8); }\n', 1, 52, "forbidden-call",
         "'operator new'"),
        ('extern "C" __global__ void k(float* x) { _Pragma("GCC dependency \\"/etc/passwd\\"") }\n', 1, 42,
         "directive-not-allowed", "'_Pragma'"),
        # A lone CR ends a line for gcc, so the include is a directive of its own.
        ('#define A 1\r#include "/etc/passwd"\n' + KERNEL, 2, 1, "include-not-allowed", '#include "/etc/passwd"'),
        # A comment is a blank: the # after it still begins a directive.
        ('/* a\n b */ #include_next "/etc/passwd"\n' + KERNEL, 2, 7, "directive-not-allowed", "#include_next"),
        # gcc ends the bad literal at the line end, so the /* is no comment: refuse rather than guess.
        ("#error it's /*\n#include \"/etc/passwd\"\n*/\n" + KERNEL, 1, 10, "source-text", "unterminated literal"),
        ('extern "C" __global__ void k(float* x) { const char* s = R"(x)"; }\n', 1, 58, "source-text", "raw string"),
        ('extern "C" __global__ void k(float* x) { mallo\\u0063(8); }\n', 1, 47, "source-text", "backslash"),
        ('??=include "/etc/passwd"\n' + KERNEL, 1, 1, "source-text", "trigraph"),
        ("/* never closed\n" + KERNEL, 1, 1, "source-text", "unterminated comment"),
        ('extern "C" __global__ void k(float* x) { # include_next "x"\n}\n', 1, 42, "directive-not-allowed",
         "only allowed to begin a directive"),
        ('#define N new\nextern "C" __global__ void k(float* x) { float* p = N float[3]; }\n', 1, 11,
         "forbidden-call", "'new'"),
        ('#include <cuda_fp16.h> "/etc/passwd"\n' + KERNEL, 1, 1, "include-not-allowed", "not allowed"),
        ("#define H <cuda_fp16.h>\n#include H\n" + KERNEL, 2, 1, "include-not-allowed", "#include H"),
    ],
)  # fmt: skip
def test_hidden_directives_and_names_are_refused(source: str, line: int, column: int, rule: str, says: str) -> None:
    found = errors(source)
    assert any((l, c, r) == (line, column, rule) and says in m for l, c, r, m in found), found  # noqa: E741


def test_allowed_directives_pass() -> None:
    source = (
        "%:define TILE 32\n"
        "#define SQUARE(v) \\\n  ((v) * (v))\n"
        "#define NAME(v) #v\n"
        "#undef TILE\n#define TILE 64\n"
        "#if defined(TILE) && TILE > 32\n#elif 0\n#else\n#endif\n"
        "#ifdef TILE\n#endif\n#ifndef NOPE\n#endif\n"
        "#\n"
        '#include "cuda_fp16.h"\n'
        "// #include_next in a comment is nothing\n"
        '/* #pragma GCC dependency "/etc/passwd" */\n'
        'extern "C" __global__ void k(float* x) {\n'
        '  const char* s = "#include_next, malloc, ##, \\" /*";\n'
        "  x[0] = 1'000'000 + SQUARE(2) + s[0] + '\\'';\n"
        "#pragma unroll 4\n  for (int i = 0; i < 4; ++i) x[i] = 0.0f;\n"
        "#pragma nounroll\n  for (int i = 0; i < 4; ++i) x[i] = 1.0f;\n"
        "}\n"
        "struct NoCopy { NoCopy(const NoCopy&) = delete; };\n"
    )
    assert errors(source) == []


def test_unreadable_text_is_one_problem() -> None:
    (nul,) = check_source(KERNEL + "\0", "k")
    assert (nul.line, nul.column, nul.rule) == (2, 1, "source-text") and "NUL" in nul.message
    (undecodable,) = check_source("// \udcff\n" + KERNEL, "k")
    assert (undecodable.line, undecodable.column, undecodable.rule) == (1, 4, "source-text")
    assert "undecodable" in undecodable.message
    (large,) = check_source(KERNEL + "// " + "x" * 200, "k", max_bytes=200)
    assert large.rule == "source-text" and "cap is 200 bytes" in large.message
    (wide,) = check_source(KERNEL + "// " + "é" * 80, "k", max_bytes=200)  # 160 more bytes than characters
    assert "bytes" in wide.message


def honest_kernels() -> list[tuple[str, str, str, list[ResolvedArg] | None]]:
    """(name, source, entry, plan arguments) for every kernel meant to pass: templates, cards, examples."""
    kernels: list[tuple[str, str, str, list[ResolvedArg] | None]] = []
    for card in all_cards():
        for params in sample(card, 12):
            proposal = render(card, params)
            args = resolve(proposal.plan, card).args
            kernels.append((f"template {card.name} {params}", proposal.source, proposal.plan.entry, args))
    for directory in sorted(p.parent for p in (EXAMPLES / "cards").glob("*/card.toml")):
        card = load_card(directory)
        plan = card.spec.baseline.plan
        kernels.append(
            (f"{directory.name} baseline", card.baseline_source(), plan.entry, resolve(plan, card.spec).args)
        )
        for path in sorted((directory / "candidates").glob("*.cu")):
            plan = load_plan(path.with_suffix(".plan.toml"))
            kernels.append((str(path), path.read_text(), plan.entry, resolve(plan, card.spec).args))
    for path in sorted((EXAMPLES / "kernels").rglob("*.cu")):
        plan_path = path.with_suffix(".plan.toml")
        if plan_path.exists():  # cheats: they build, and are caught at run time
            plan = load_plan(plan_path)
            card = load_card(EXAMPLES / "cards" / path.parent.name)
            kernels.append((str(path), path.read_text(), plan.entry, resolve(plan, card.spec).args))
        else:
            entry = re.search(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', path.read_text())
            assert entry is not None, path
            kernels.append((str(path), path.read_text(), entry.group(1), None))
    return kernels


def test_every_honest_kernel_passes_with_its_plan() -> None:
    kernels = honest_kernels()
    assert len(kernels) > 100
    for name, source, entry, args in kernels:
        assert [p for p in check_source(source, entry, args=args) if p.severity == "error"] == [], name


def tensor(name: str) -> ResolvedArg:
    return ResolvedArg(kind="tensor", name=name)


def scalar(name: str, scalar_type: str = "int32") -> ResolvedArg:
    return ResolvedArg(kind="scalar", name=name, scalar_type=scalar_type, value=7)


PARAMS = (
    'extern "C" __global__ void k(const float* __restrict__ x, float y[], long long n, unsigned m,\n'
    "                             std::int64_t q, size_t s, const int c, float f, int) {}\n"
)
MATCHING = [tensor("x"), tensor("y"), scalar("n", "int64"), scalar("m", "uint32"), scalar("q", "int64"),
            scalar("s", "uint64"), scalar("c"), scalar("f", "float32"), scalar("u")]  # fmt: skip


def plan_problems(source: str, args: list[ResolvedArg]) -> list[SourceProblem]:
    return [p for p in check_source(source, "k", args=args) if p.severity == "error"]


def test_plan_arguments_that_match_pass() -> None:
    assert plan_problems(PARAMS, MATCHING) == []


@pytest.mark.parametrize(
    ("index", "arg", "declared", "says"),
    [
        (2, scalar("n"), "long long n", "parameter 3 'n' (long long n) receives 'n' as int32, but it is int64"),
        (3, scalar("m", "int32"), "unsigned m", "'m' as int32, but it is uint32"),
        (0, scalar("rows"), "const float*", "parameter 1 'x' (const float* __restrict__ x) receives 'rows' as int32"),
        (6, tensor("x"), "const int c", "parameter 7 'c' (const int c) receives tensor 'x' (a device pointer)"),
        (7, scalar("f"), "float f", "'f' as int32, but it is float32"),
    ],
)  # fmt: skip
def test_plan_argument_mismatch_names_the_parameter(index: int, arg: ResolvedArg, declared: str, says: str) -> None:
    args = [*MATCHING[:index], arg, *MATCHING[index + 1 :]]
    (problem,) = plan_problems(PARAMS, args)
    assert problem.rule == "plan-mismatch" and says in problem.message, problem.message
    assert PARAMS.splitlines()[problem.line - 1].index(declared) + 1 == problem.column


def test_plan_argument_count_must_match() -> None:
    (problem,) = plan_problems(PARAMS, MATCHING[:-1])
    assert problem.rule == "plan-mismatch" and (problem.line, problem.column) == (1, 29)
    assert "the plan passes 8 arguments" in problem.message and "takes 9 parameters" in problem.message


@pytest.mark.parametrize(
    ("parameter", "arg", "says"),
    [
        ("float** x", tensor("x"), "a tensor is a single device pointer"),
        ("int& n", scalar("n"), "a plan passes pointers and scalars only"),
        ("Params p", scalar("n"), "a plan passes int, unsigned"),
        ("short n", scalar("n"), "but it is int16"),
    ],
)
def test_parameters_a_plan_cannot_pass(parameter: str, arg: ResolvedArg, says: str) -> None:
    (problem,) = plan_problems(f'extern "C" __global__ void k({parameter}) {{}}\n', [arg])
    assert problem.rule == "plan-mismatch" and says in problem.message


def test_no_plan_no_argument_check() -> None:
    assert check_source('extern "C" __global__ void k(short n) {}\n', "k") == []
