"""Static checks on untrusted candidate CUDA source, run with tree-sitter before nvcc sees it.

Why: a candidate is device code only. The harness launches it from a LaunchPlan and looks its entry
point up by name in the cubin, so the source must not launch kernels, create host-side work, read
arbitrary headers, or hide its entry point behind C++ name mangling. nvcc would accept much of that;
this pass turns it into problems a coder (person or LLM) can fix, with line and column.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from functools import cache
from typing import Literal

import tree_sitter_cuda
from pydantic import BaseModel
from tree_sitter import Language, Node, Parser

Rule = Literal[
    "entry-missing",
    "entry-not-global",
    "entry-not-extern-c",
    "include-not-allowed",
    "host-launch",
    "forbidden-call",
    "host-function",
    "syntax-error",
]
Severity = Literal["error", "warning"]

DEFAULT_ALLOWED_INCLUDES: frozenset[str] = frozenset(
    {
        # Numeric types and intrinsics.
        "cuda_fp16.h",
        "cuda_bf16.h",
        "cuda_fp8.h",
        "math_constants.h",
        "mma.h",
        "cuda_pipeline.h",
        # Block and warp cooperation.
        "cooperative_groups.h",
        "cooperative_groups/reduce.h",
        "cooperative_groups/memcpy_async.h",
        "cuda/barrier",
        "cuda/pipeline",
        "cuda/atomic",
        "cuda/std/*",
        "cub/block/*",
        "cub/warp/*",
        "cub/thread/*",
        # Plain C/C++ headers with no host side effects.
        "stdint.h",
        "cstdint",
        "float.h",
        "cfloat",
        "limits.h",
        "climits",
        "stddef.h",
        "cstddef",
    }
)
"""Device-side headers a candidate may include; an entry with `*` is an `fnmatch` pattern.

Host runtime headers (cuda_runtime.h, cstdio, cstdlib, ...) are left out on purpose: a candidate has
no host code, and cub's device-wide algorithms (cub/device/*) launch kernels of their own.
"""

FORBIDDEN_NAMES: frozenset[str] = frozenset(
    {
        "malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign",
        "fopen", "fclose", "fread", "fwrite", "fprintf", "fputs", "fflush", "remove", "rename",
        "open", "close", "read", "write", "mmap", "munmap",
        "system", "popen", "fork", "execv", "execve", "execvp", "execl", "execlp", "dlopen", "getenv",
        "exit", "abort",
    }
)  # fmt: skip
"""C library calls that allocate, do I/O, or reach the operating system."""

FORBIDDEN_PREFIXES: tuple[str, ...] = (
    "cudaStream", "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemset", "cudaMemPrefetch",
    "cudaLaunch", "cudaGraph", "cudaEvent", "cudaHost", "cudaDevice", "cudaSetDevice",
    "cudaGetParameterBuffer", "cudaMemPool", "cuLaunch", "cuMem", "cuStream", "cuGraph", "cuCtx",
)  # fmt: skip
"""CUDA runtime and driver API families that create work, memory or streams outside the launch.

Device-side helpers such as `cudaGridDependencySynchronize` (programmatic dependent launch) stay allowed.
"""

_WORD = re.compile(r"[A-Za-z_]\w*")
_QUALIFIERS = frozenset({"__global__", "__device__", "__host__"})


class SourceProblem(BaseModel):
    """One finding, placed at a 1-based line and column of the candidate source."""

    line: int
    column: int
    rule: Rule
    severity: Severity = "error"
    message: str


@cache
def _parser() -> Parser:
    return Parser(Language(tree_sitter_cuda.language()))


def _text(node: Node) -> str:
    return node.text.decode("utf-8", "replace") if node.text is not None else ""


def _problem(node: Node, rule: Rule, message: str, severity: Severity = "error") -> SourceProblem:
    row, col = node.start_point
    return SourceProblem(line=row + 1, column=col + 1, rule=rule, severity=severity, message=message)


def _walk(node: Node) -> Iterator[Node]:
    """Every node, in source order (iterative: deeply nested code must not hit the recursion limit)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def _is_forbidden(name: str) -> bool:
    return name in FORBIDDEN_NAMES or name.startswith(FORBIDDEN_PREFIXES)


def _include_allowed(name: str, allowed: frozenset[str]) -> bool:
    if ".." in name.split("/"):
        return False
    return any(fnmatch.fnmatchcase(name, pattern) if "*" in pattern else name == pattern for pattern in allowed)


def _function_name(definition: Node) -> Node | None:
    """The identifier a function definition defines, looking through pointer/reference declarators."""
    declarator = definition.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    if declarator is None:
        return None
    name = declarator.child_by_field_name("declarator")
    return name if name is not None and name.type == "identifier" else None


def _qualifiers(definition: Node) -> set[str]:
    """`__global__`/`__device__`/`__host__` anywhere in the head (they may sit inside a declarator)."""
    body = definition.child_by_field_name("body")
    found: set[str] = set()
    stack = [child for child in definition.children if child != body]
    while stack:
        node = stack.pop()
        if node.type in _QUALIFIERS:
            found.add(node.type)
        elif node.type != "parameter_list":
            stack.extend(node.children)
    return found


def _has_c_linkage(definition: Node) -> bool:
    """True inside `extern "C"` (a single declaration or a block) and not inside a template."""
    node = definition.parent
    while node is not None:
        if node.type == "template_declaration":
            return False
        if node.type == "linkage_specification":
            value = node.child_by_field_name("value")
            return value is not None and _text(value) == '"C"'
        node = node.parent
    return False


def _check_entry(definitions: list[Node], entry: str) -> list[SourceProblem]:
    named = [d for d in definitions if (n := _function_name(d)) is not None and _text(n) == entry]
    fix = f'define it as: extern "C" __global__ void {entry}(...) {{ ... }}'
    if not named:
        kernels = sorted({_text(n) for d in definitions if "__global__" in _qualifiers(d) and (n := _function_name(d))})
        found = f" (kernels found: {', '.join(kernels)})" if kernels else ""
        return [
            SourceProblem(
                line=1, column=1, rule="entry-missing",
                message=f"no definition of the entry point '{entry}'{found}; {fix}",
            )
        ]  # fmt: skip
    definition = named[0]
    problems: list[SourceProblem] = []
    if "__global__" not in _qualifiers(definition):
        problems.append(_problem(definition, "entry-not-global", f"'{entry}' must be a __global__ kernel; {fix}"))
    if not _has_c_linkage(definition):
        problems.append(
            _problem(
                definition,
                "entry-not-extern-c",
                f"'{entry}' would get a C++ mangled name that the harness cannot look up (templates "
                f'included); {fix}, or wrap it in extern "C" {{ ... }}',
            )
        )
    return problems


def check_source(
    source: str, entry: str, allowed_includes: frozenset[str] = DEFAULT_ALLOWED_INCLUDES
) -> list[SourceProblem]:
    """All problems in `source`, in source order; only severity "error" ones should block a build."""
    tree = _parser().parse(source.encode("utf-8"))
    problems: list[SourceProblem] = []
    definitions: list[Node] = []
    for node in _walk(tree.root_node):
        if node.type == "function_definition":
            definitions.append(node)
            problems.extend(_check_definition(node))
        elif node.type == "preproc_include":
            problems.extend(_check_include(node, allowed_includes))
        elif node.type == "kernel_call_syntax":
            problems.append(
                _problem(
                    node,
                    "host-launch",
                    "kernel launches (<<<...>>>) are not allowed in a candidate: the harness launches the "
                    "entry point from the launch plan; do the work inside this kernel or a __device__ helper",
                )
            )
        elif node.type == "identifier" and _is_forbidden(_text(node)):
            problems.append(_forbidden(node, _text(node)))
        elif node.type == "preproc_arg":
            problems.extend(_forbidden(node, word) for word in _WORD.findall(_text(node)) if _is_forbidden(word))
        elif node.type == "new_expression" and node.child_by_field_name("placement") is None:
            problems.append(_forbidden(node, "new"))
        elif node.type == "delete_expression":
            problems.append(_forbidden(node, "delete"))
        elif node.type == "ERROR" or node.is_missing:
            what = f"missing '{node.type}'" if node.is_missing else f"cannot parse '{_text(node)[:40]}'"
            problems.append(
                _problem(
                    node,
                    "syntax-error",
                    f"{what}; nvcc will tell if this is a real error (the CUDA grammar misreads some valid code)",
                    severity="warning",
                )
            )
    problems.extend(_check_entry(definitions, entry))
    return sorted(problems, key=lambda p: (p.line, p.column))


def _forbidden(node: Node, name: str) -> SourceProblem:
    return _problem(
        node,
        "forbidden-call",
        f"'{name}' is not allowed: a candidate may not allocate memory, do I/O, create streams or "
        "launch work; use the buffers and shared memory the launch plan provides",
    )


def _check_definition(definition: Node) -> list[SourceProblem]:
    name = _function_name(definition)
    qualifiers = _qualifiers(definition)
    if name is not None and _text(name) == "main":
        return [_problem(definition, "host-function", "remove main(): a candidate is device code only")]
    if "__host__" in qualifiers and not qualifiers & {"__device__", "__global__"}:
        label = _text(name) if name is not None else "this function"
        return [
            _problem(
                definition,
                "host-function",
                f"'{label}' is __host__ only: host code never runs; make it __device__ or remove it",
            )
        ]
    return []


def _check_include(node: Node, allowed: frozenset[str]) -> list[SourceProblem]:
    path = node.child_by_field_name("path")
    raw = _text(path) if path is not None else ""
    name = raw[1:-1] if raw[:1] in '<"' and raw[-1:] in '>"' else raw
    literal = path is not None and path.type in ("system_lib_string", "string_literal")
    if literal and _include_allowed(name, allowed):
        return []
    return [
        _problem(
            node,
            "include-not-allowed",
            f"#include {raw} is not allowed; allowed device headers: {', '.join(sorted(allowed))}",
        )
    ]
