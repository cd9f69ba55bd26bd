"""The checks read from tree-sitter's parse of the spliced text: what the source defines.

Syntax errors (warnings only: the CUDA grammar misreads some valid code, and nvcc has the last word),
host-only functions and `main`, placement new (which the token guard then allows), and the entry point:
defined, `__global__`, with C linkage so the harness finds it by name, and its parameters against the plan
(`param_check`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from tree_sitter import Node

from kernelforge_tui.build.cuda_syntax import node_text
from kernelforge_tui.build.param_check import check_arguments
from kernelforge_tui.build.source_problem import SourceProblem, Where
from kernelforge_tui.cards.plan import ResolvedArg

_QUALIFIERS = frozenset({"__global__", "__device__", "__host__"})


@dataclass
class TreeScan:
    """One walk over the tree: the problems it found, the function definitions, the placement news' offsets."""

    problems: list[SourceProblem] = field(default_factory=list)
    definitions: list[Node] = field(default_factory=list)
    placement_news: set[int] = field(default_factory=set)


def scan_tree(root: Node, where: Where) -> TreeScan:
    """Syntax errors and host functions, with the definitions and placement news the other checks need."""
    scan = TreeScan()
    for node in _walk(root):
        if node.type == "function_definition":
            scan.definitions.append(node)
            scan.problems.extend(_check_definition(node, where))
        elif node.type == "new_expression" and node.child_by_field_name("placement") is not None:
            scan.placement_news.update(where.char(c.start_byte) for c in node.children if c.type == "new")
        elif node.type == "ERROR" or node.is_missing:
            what = f"missing '{node.type}'" if node.is_missing else f"cannot parse '{node_text(node)[:40]}'"
            scan.problems.append(
                where.node_problem(
                    node,
                    "syntax-error",
                    f"{what}; nvcc will tell if this is a real error (the CUDA grammar misreads some valid code)",
                    severity="warning",
                )
            )
    return scan


def check_entry(
    definitions: list[Node], entry: str, args: Sequence[ResolvedArg] | None, where: Where
) -> list[SourceProblem]:
    """The entry point: defined, a `__global__` kernel, with C linkage; with `args`, its parameters too."""
    named = [d for d in definitions if (n := _function_name(d)) is not None and node_text(n) == entry]
    fix = f'define it as: extern "C" __global__ void {entry}(...) {{ ... }}'
    if not named:
        kernels = sorted(
            {node_text(n) for d in definitions if "__global__" in _qualifiers(d) and (n := _function_name(d))}
        )
        found = f" (kernels found: {', '.join(kernels)})" if kernels else ""
        message = f"no definition of the entry point '{entry}'{found}; {fix}"
        return [SourceProblem(line=1, column=1, rule="entry-missing", message=message)]
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
        problems.extend(check_arguments(entry, parameters, args, where))
    return problems


def _walk(node: Node) -> Iterator[Node]:
    """Every node, in source order (iterative: deeply nested code must not hit the recursion limit)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


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
            return value is not None and node_text(value) == '"C"'
        node = node.parent
    return False


def _check_definition(definition: Node, where: Where) -> list[SourceProblem]:
    name = _function_name(definition)
    qualifiers = _qualifiers(definition)
    if name is not None and node_text(name) == "main":
        return [where.node_problem(definition, "host-function", "remove main(): a candidate is device code only")]
    if "__host__" in qualifiers and not qualifiers & {"__device__", "__global__"}:
        label = node_text(name) if name is not None else "this function"
        return [
            where.node_problem(
                definition,
                "host-function",
                f"'{label}' is __host__ only: host code never runs; make it __device__ or remove it",
            )
        ]
    return []
