"""Static checks on untrusted candidate CUDA source, before nvcc sees it.

Why: a candidate is device code only. The harness launches it from a LaunchPlan and looks its entry
point up by name in the cubin, so the source must not launch kernels, create host-side work, read
arbitrary files, or hide its entry point behind C++ name mangling. Each finding has a line and column a
coder (person or LLM) can act on.

The preprocessor rules are a guard, not a lint: the text is read as nvcc's preprocessor reads it
(`cuda_tokens`: line ends, splices, comments and digraphs applied, anything ambiguous refused), then
- every directive is on an allow-list: `#include` of an allowed header, `#define`, `#undef`, the
  conditionals, `#pragma unroll`/`nounroll`, `#error`, `#warning`; `#include_next`, `#import`, `#line`,
  gcc line markers and every other pragma are refused, and so is a `#` anywhere but a `#define` body;
- `__has_include`, `__has_include_next`, `__has_embed`, `_Pragma` and `__pragma` are refused wherever they
  appear: they probe host files or turn macros into directives;
- token pasting (`##`) is refused everywhere. Without it no macro can make a new identifier, so every
  identifier the compiler sees after expansion is spelled out in the source, and the scan of identifier
  tokens (macro bodies included) finds every forbidden name (`malloc`, `operator new`, ...).
Why not check `nvcc -E` output instead: preprocessing opens the very files in question (so it needs this
guard first anyway), costs a second compiler run per candidate, and the headers it pulls in mention malloc
and new themselves. tree-sitter (on the spliced text) then finds the entry point, its parameters for the
plan check, host-only functions and placement new.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from typing import Literal

from pydantic import BaseModel
from tree_sitter import Node

from kernelforge_tui.cards.plan import ResolvedArg
from kernelforge_tui.gpu.cuda_syntax import parse_cuda
from kernelforge_tui.gpu.cuda_tokens import HASH, PASTE, LexError, Logical, Token, logical_source, tokenize

Rule = Literal[
    "source-text",
    "directive-not-allowed",
    "include-not-allowed",
    "token-paste",
    "entry-missing",
    "entry-not-global",
    "entry-not-extern-c",
    "plan-mismatch",
    "host-launch",
    "forbidden-call",
    "host-function",
    "syntax-error",
]
Severity = Literal["error", "warning"]

MAX_SOURCE_BYTES = 1 << 20
"""Sources over this many UTF-8 bytes are refused before anything parses them (hand-written kernels are KBs)."""

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

ALLOWED_DIRECTIVES: frozenset[str] = frozenset(
    {"include", "define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif", "pragma", "error", "warning"}
)
ALLOWED_PRAGMAS: frozenset[str] = frozenset({"unroll", "nounroll"})
FILE_AND_PRAGMA_OPERATORS: frozenset[str] = frozenset(
    {"__has_include", "__has_include_next", "__has_include__", "__has_include_next__", "__has_embed", "_Pragma",
     "__pragma"}
)  # fmt: skip
"""Refused wherever they appear: file-existence probes (gcc before 10 spells them with trailing `__` too)
and pragmas made from macros."""

_QUALIFIERS = frozenset({"__global__", "__device__", "__host__"})
_DIRECTIVES_HELP = (
    "allowed: #include <allowed header>, #define, #undef, #if, #ifdef, #ifndef, #elif, #else, #endif, "
    "#pragma unroll, #pragma nounroll, #error, #warning"
)

_WIDTHS = {"char": 8, "short": 16, "long": 64}
_NAMED_SCALARS = {
    **{f"int{bits}_t": f"int{bits}" for bits in (8, 16, 32, 64)},
    **{f"uint{bits}_t": f"uint{bits}" for bits in (8, 16, 32, 64)},
    "size_t": "uint64", "ssize_t": "int64", "ptrdiff_t": "int64", "intptr_t": "int64", "uintptr_t": "uint64",
    "float": "float32", "double": "float64", "bool": "bool", "char": "int8",
}  # fmt: skip
"""Parameter types a plan can be compared with, as the plan's scalar type names (Linux LP64 widths)."""


class SourceProblem(BaseModel):
    """One finding, placed at a 1-based line and column of the candidate source."""

    line: int
    column: int
    rule: Rule
    severity: Severity = "error"
    message: str


class _Where:
    """Places logical-text offsets (tokens) and tree-sitter byte offsets in the original source."""

    def __init__(self, logical: Logical) -> None:
        self.logical = logical
        self.data = logical.text.encode("utf-8")
        self.ascii = len(self.data) == len(logical.text)

    def char(self, byte: int) -> int:
        return byte if self.ascii else len(self.data[:byte].decode("utf-8", "replace"))

    def problem(self, offset: int, rule: Rule, message: str, severity: Severity = "error") -> SourceProblem:
        line, column = self.logical.position(offset)
        return SourceProblem(line=line, column=column, rule=rule, severity=severity, message=message)

    def node_problem(self, node: Node, rule: Rule, message: str, severity: Severity = "error") -> SourceProblem:
        return self.problem(self.char(node.start_byte), rule, message, severity)


def check_source(
    source: str,
    entry: str,
    allowed_includes: frozenset[str] = DEFAULT_ALLOWED_INCLUDES,
    args: Sequence[ResolvedArg] | None = None,
    max_bytes: int = MAX_SOURCE_BYTES,
) -> list[SourceProblem]:
    """All problems in `source`, in source order; only severity "error" ones should block a build.

    With `args` (the resolved launch plan's arguments), the entry's parameters must match them in count,
    pointer versus scalar, and scalar type. Unreadable text (too big, not UTF-8, NUL) is one problem alone.
    """
    if (text_problem := _check_text(source, max_bytes)) is not None:
        return [text_problem]
    logical = logical_source(source)
    where = _Where(logical)
    try:
        tokens = tokenize(logical)
    except LexError as exc:
        return [where.problem(exc.offset, "source-text", exc.message)]
    tree = parse_cuda(where.data)
    problems: list[SourceProblem] = []
    definitions: list[Node] = []
    placement_news: set[int] = set()
    for node in _walk(tree.root_node):
        if node.type == "function_definition":
            definitions.append(node)
            problems.extend(_check_definition(node, where))
        elif node.type == "new_expression" and node.child_by_field_name("placement") is not None:
            placement_news.update(where.char(c.start_byte) for c in node.children if c.type == "new")
        elif node.type == "ERROR" or node.is_missing:
            what = f"missing '{node.type}'" if node.is_missing else f"cannot parse '{_text(node)[:40]}'"
            problems.append(
                where.node_problem(
                    node,
                    "syntax-error",
                    f"{what}; nvcc will tell if this is a real error (the CUDA grammar misreads some valid code)",
                    severity="warning",
                )
            )
    problems.extend(_check_tokens(tokens, where, allowed_includes, placement_news))
    problems.extend(_check_entry(definitions, entry, args, where))
    return sorted(problems, key=lambda p: (p.line, p.column))


def _check_text(source: str, max_bytes: int) -> SourceProblem | None:
    """Size, encoding and NUL: refused before any parsing, so a huge or binary proposal costs nothing."""
    cap = f"the cap is {max_bytes} bytes: a kernel source is a few KB"
    if len(source) > max_bytes:
        return SourceProblem(line=1, column=1, rule="source-text", message=f"the source is too large; {cap}")
    try:
        size = len(source.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return _raw_problem(source, exc.start, f"character {source[exc.start]!a} is not text (undecodable input)")
    if size > max_bytes:
        return SourceProblem(line=1, column=1, rule="source-text", message=f"the source is {size} bytes; {cap}")
    if (nul := source.find("\0")) >= 0:
        return _raw_problem(source, nul, "NUL character in the source")
    return None


def _raw_problem(source: str, index: int, message: str) -> SourceProblem:
    before = source[:index].replace("\r\n", "\n").replace("\r", "\n")
    line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
    return SourceProblem(line=line, column=column, rule="source-text", message=message)


def _text(node: Node) -> str:
    return node.text.decode("utf-8", "replace") if node.text is not None else ""


def _walk(node: Node) -> Iterator[Node]:
    """Every node, in source order (iterative: deeply nested code must not hit the recursion limit)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def _lines(tokens: list[Token]) -> Iterator[list[Token]]:
    line: list[Token] = []
    for token in tokens:
        if token.first and line:
            yield line
            line = []
        line.append(token)
    if line:
        yield line


def _check_tokens(
    tokens: list[Token], where: _Where, allowed: frozenset[str], placement_news: set[int]
) -> list[SourceProblem]:
    problems: list[SourceProblem] = []
    for line in _lines(tokens):
        code, in_define = line, False
        if line[0].text in HASH:
            problems.extend(_check_directive(line, where, allowed))
            name = line[1].text if len(line) > 1 else ""
            if name in ("error", "warning"):
                continue  # message text, not code
            code, in_define = line[2:], name == "define"
        problems.extend(_check_code(code, where, in_define, placement_news))
    return problems


def _check_directive(line: list[Token], where: _Where, allowed: frozenset[str]) -> list[SourceProblem]:
    if len(line) == 1:
        return []  # the null directive
    name = line[1]
    if name.text == "include":
        return _check_include(line, where, allowed)
    if name.text == "pragma":
        args = line[2:]
        if args and args[0].text in ALLOWED_PRAGMAS and all(t.kind != "literal" for t in args):
            return []
        text = " ".join(t.text for t in line[1:4])
        return [where.problem(line[0].start, "directive-not-allowed", f"#{text} is not allowed; {_DIRECTIVES_HELP}")]
    if name.kind == "identifier" and name.text in ALLOWED_DIRECTIVES:
        return []
    what = f"#{name.text}" if name.kind == "identifier" else f"the line marker '# {name.text}'"
    return [where.problem(line[0].start, "directive-not-allowed", f"{what} is not allowed; {_DIRECTIVES_HELP}")]


def _check_include(line: list[Token], where: _Where, allowed: frozenset[str]) -> list[SourceProblem]:
    path = line[2:]
    if len(path) == 1 and path[0].kind == "header" and _include_allowed(path[0].text[1:-1], allowed):
        return []
    raw = " ".join(t.text for t in path) or "(nothing)"
    return [
        where.problem(
            line[0].start,
            "include-not-allowed",
            f"#include {raw} is not allowed; allowed device headers: {', '.join(sorted(allowed))}",
        )
    ]


def _include_allowed(name: str, allowed: frozenset[str]) -> bool:
    if ".." in name.split("/"):
        return False
    return any(fnmatch.fnmatchcase(name, pattern) if "*" in pattern else name == pattern for pattern in allowed)


def _check_code(tokens: list[Token], where: _Where, in_define: bool, placement_news: set[int]) -> list[SourceProblem]:
    """Rules on the tokens of code and of directive arguments (macro bodies included)."""
    problems: list[SourceProblem] = []
    skip = False
    for i, token in enumerate(tokens):
        if skip:
            skip = False
            continue
        before = tokens[i - 1].text if i > 0 else ""
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        text = token.text
        if text in PASTE:
            problems.append(
                where.problem(
                    token.start,
                    "token-paste",
                    f"'{text}' (token pasting) is not allowed: it builds names the check cannot see; "
                    "write the identifier out",
                )
            )
        elif text in HASH and not in_define:
            problems.append(
                where.problem(token.start, "directive-not-allowed", f"'{text}' is only allowed to begin a directive")
            )
        elif text in FILE_AND_PRAGMA_OPERATORS:
            problems.append(
                where.problem(
                    token.start,
                    "directive-not-allowed",
                    f"'{text}' is not allowed: it probes host files or makes a pragma out of a macro",
                )
            )
        elif text == "operator" and after is not None and after.text in ("new", "delete"):
            problems.append(_forbidden(where, token, f"operator {after.text}"))
            skip = True
        elif token.kind == "identifier" and _is_forbidden(text):
            problems.append(_forbidden(where, token, text))
        elif text == "new" and token.start not in placement_news:
            problems.append(_forbidden(where, token, "new"))
        elif text == "delete" and not (before == "=" and after is not None and after.text == ";"):
            problems.append(_forbidden(where, token, "delete"))
        elif text == "<<" and after is not None and after.text == "<" and after.start == token.end:
            problems.append(
                where.problem(
                    token.start,
                    "host-launch",
                    "kernel launches (<<<...>>>) are not allowed in a candidate: the harness launches the "
                    "entry point from the launch plan; do the work inside this kernel or a __device__ helper",
                )
            )
    return problems


def _is_forbidden(name: str) -> bool:
    return name in FORBIDDEN_NAMES or name.startswith(FORBIDDEN_PREFIXES)


def _forbidden(where: _Where, token: Token, name: str) -> SourceProblem:
    return where.problem(
        token.start,
        "forbidden-call",
        f"'{name}' is not allowed: a candidate may not allocate memory, do I/O, create streams or "
        "launch work; use the buffers and shared memory the launch plan provides",
    )


def _function_declarator(definition: Node) -> Node | None:
    declarator = definition.child_by_field_name("declarator")
    while declarator is not None and declarator.type != "function_declarator":
        declarator = declarator.child_by_field_name("declarator")
    return declarator


def _function_name(definition: Node) -> Node | None:
    """The identifier a function definition defines, looking through pointer/reference declarators."""
    declarator = _function_declarator(definition)
    name = declarator.child_by_field_name("declarator") if declarator is not None else None
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


def _check_entry(
    definitions: list[Node], entry: str, args: Sequence[ResolvedArg] | None, where: _Where
) -> list[SourceProblem]:
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
        problems.append(
            where.node_problem(definition, "entry-not-global", f"'{entry}' must be a __global__ kernel; {fix}")
        )
    if not _has_c_linkage(definition):
        problems.append(
            where.node_problem(
                definition,
                "entry-not-extern-c",
                f"'{entry}' would get a C++ mangled name that the harness cannot look up (templates "
                f'included); {fix}, or wrap it in extern "C" {{ ... }}',
            )
        )
    declarator = _function_declarator(definition)
    parameters = declarator.child_by_field_name("parameters") if declarator is not None else None
    if args is not None and parameters is not None:
        problems.extend(_check_arguments(entry, parameters, args, where))
    return problems


def _check_definition(definition: Node, where: _Where) -> list[SourceProblem]:
    name = _function_name(definition)
    qualifiers = _qualifiers(definition)
    if name is not None and _text(name) == "main":
        return [where.node_problem(definition, "host-function", "remove main(): a candidate is device code only")]
    if "__host__" in qualifiers and not qualifiers & {"__device__", "__global__"}:
        label = _text(name) if name is not None else "this function"
        return [
            where.node_problem(
                definition,
                "host-function",
                f"'{label}' is __host__ only: host code never runs; make it __device__ or remove it",
            )
        ]
    return []


class _Parameter(BaseModel):
    """How a kernel parameter receives its argument: a pointer, a scalar of a known type, or neither."""

    name: str
    declared: str
    kind: Literal["pointer", "scalar", "other"]
    scalar_type: str = ""
    why: str = ""


def _parameter(node: Node) -> _Parameter:
    type_node = node.child_by_field_name("type")
    declarator = node.child_by_field_name("declarator")
    declared = " ".join(_text(node).split())
    levels = 0
    while declarator is not None and declarator.type in ("pointer_declarator", "array_declarator"):
        levels += 1
        declarator = declarator.child_by_field_name("declarator")
    name = _text(declarator) if declarator is not None and declarator.type == "identifier" else "(unnamed)"
    if declarator is not None and declarator.type not in ("identifier", "pointer_declarator", "array_declarator"):
        return _Parameter(name=name, declared=declared, kind="other", why="a plan passes pointers and scalars only")
    if levels > 1:
        return _Parameter(name=name, declared=declared, kind="other", why="a tensor is a single device pointer")
    if levels == 1:
        return _Parameter(name=name, declared=declared, kind="pointer")
    scalar = _scalar_type(_text(type_node) if type_node is not None else "")
    if scalar is None:
        why = "a plan passes int, unsigned, long long, unsigned long long (or the <stdint.h> names) and float"
        return _Parameter(name=name, declared=declared, kind="other", why=why)
    return _Parameter(name=name, declared=declared, kind="scalar", scalar_type=scalar)


def _scalar_type(spelled: str) -> str | None:
    """`unsigned long long` -> "uint64", `std::int32_t` -> "int32"; None for types a plan cannot pass."""
    words = spelled.removeprefix("::").removeprefix("std::").split()
    if len(words) == 1 and words[0] in _NAMED_SCALARS:
        return _NAMED_SCALARS[words[0]]
    if not words or any(w not in ("signed", "unsigned", "int", "char", "short", "long") for w in words):
        return None
    sized = [w for w in words if w in _WIDTHS]
    if len(set(sized)) > 1:
        return None
    bits = _WIDTHS[sized[0]] if sized else 32
    return f"{'u' if 'unsigned' in words else ''}int{bits}"


def _check_arguments(entry: str, parameters: Node, args: Sequence[ResolvedArg], where: _Where) -> list[SourceProblem]:
    """The plan's arguments against the entry's parameters: count, pointer versus scalar, scalar type."""
    declared = [_parameter(p) for p in parameters.named_children if p.type == "parameter_declaration"]
    if any(c.type in ("...", "variadic_parameter") for c in parameters.children):
        return [
            where.node_problem(parameters, "plan-mismatch", f"'{entry}' is variadic: a kernel takes fixed parameters")
        ]
    if len(declared) != len(args):
        taken = ", ".join(p.name for p in declared) or "none"
        given = ", ".join(a.name for a in args) or "none"
        return [
            where.node_problem(
                parameters,
                "plan-mismatch",
                f"the plan passes {len(args)} arguments ({given}) but '{entry}' takes {len(declared)} "
                f"parameters ({taken}); make the plan's args match the parameter list",
            )
        ]
    problems: list[SourceProblem] = []
    nodes = [p for p in parameters.named_children if p.type == "parameter_declaration"]
    for index, (node, parameter, arg) in enumerate(zip(nodes, declared, args, strict=True), start=1):
        passed = (
            f"tensor '{arg.name}' (a device pointer)" if arg.kind == "tensor" else f"'{arg.name}' as {arg.scalar_type}"
        )
        head = f"parameter {index} '{parameter.name}' ({parameter.declared}) receives {passed}"
        message = ""
        if parameter.kind == "other":
            message = f"{head}: {parameter.why}"
        elif arg.kind == "tensor" and parameter.kind != "pointer":
            message = f"{head}: declare it as a pointer, or pass a size in the plan"
        elif arg.kind == "scalar" and parameter.kind == "pointer":
            message = f"{head}: a scalar is not a pointer; pass a tensor name in the plan"
        elif arg.kind == "scalar" and parameter.scalar_type != arg.scalar_type:
            message = (
                f"{head}, but it is {parameter.scalar_type}: the kernel would read the wrong bits; "
                f"type the plan's argument (':i32', ':i64', ':u32', ':u64', ':f32') or the parameter to match"
            )
        if message:
            problems.append(where.node_problem(node, "plan-mismatch", message))
    return problems
