"""The entry's parameter list against the launch plan's arguments: count, pointer, tensor map or scalar, scalar type.

Why: the harness packs each argument as the plan types it, so a plan that passes a 64-bit size where the
kernel reads a 32-bit int, or a size where it reads a pointer, would run and read the wrong bits; here it is
a finding at the parameter, before a build.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel
from tree_sitter import Node

from kernelforge_tui.build.cuda_syntax import node_text
from kernelforge_tui.build.source_problem import SourceProblem, Where
from kernelforge_tui.cards.plan import ResolvedArg

_WIDTHS = {"char": 8, "short": 16, "long": 64}
_NAMED_SCALARS = {
    **{f"int{bits}_t": f"int{bits}" for bits in (8, 16, 32, 64)},
    **{f"uint{bits}_t": f"uint{bits}" for bits in (8, 16, 32, 64)},
    "size_t": "uint64",
    "ssize_t": "int64",
    "ptrdiff_t": "int64",
    "intptr_t": "int64",
    "uintptr_t": "uint64",
    "float": "float32",
    "double": "float64",
    "bool": "bool",
    "char": "int8",
}
"""Parameter types a plan can be compared with, as the plan's scalar type names (Linux LP64 widths)."""
MAP_TYPES = frozenset({"CUtensorMap", "CUtensorMap_st", "TmaDescriptor", "cute::TmaDescriptor"})
"""How a kernel spells the 128-byte TMA map a plan's `tensor_maps` entry passes by value."""
MAP_DECLARATION = "const __grid_constant__ CUtensorMap"


class _Parameter(BaseModel):
    """How a kernel parameter receives its argument: a pointer, a scalar of a known type, or neither."""

    name: str
    declared: str
    kind: Literal["pointer", "scalar", "map", "other"]
    scalar_type: str = ""
    why: str = ""


def _parameter(node: Node) -> _Parameter:
    type_node = node.child_by_field_name("type")
    declarator = node.child_by_field_name("declarator")
    declared = " ".join(node_text(node).split())
    levels = 0
    while declarator is not None and declarator.type in ("pointer_declarator", "array_declarator"):
        levels += 1
        declarator = declarator.child_by_field_name("declarator")
    name = node_text(declarator) if declarator is not None and declarator.type == "identifier" else "(unnamed)"
    if declarator is not None and declarator.type not in ("identifier", "pointer_declarator", "array_declarator"):
        return _Parameter(name=name, declared=declared, kind="other", why="a plan passes pointers and scalars only")
    if levels > 1:
        return _Parameter(name=name, declared=declared, kind="other", why="a tensor is a single device pointer")
    if levels == 1:
        return _Parameter(name=name, declared=declared, kind="pointer")
    words = declared.split()
    if any(w.removeprefix("::") in MAP_TYPES for w in words):
        if "__grid_constant__" not in words or "const" not in words:
            why = f"a TMA reads its map in the kernel's parameter space: declare it `{MAP_DECLARATION} {name}`"
            return _Parameter(name=name, declared=declared, kind="other", why=why)
        return _Parameter(name=name, declared=declared, kind="map")
    scalar = _scalar_type(node_text(type_node) if type_node is not None else "")
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


def check_arguments(entry: str, parameters: Node, args: Sequence[ResolvedArg], where: Where) -> list[SourceProblem]:
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
        passed = {
            "tensor": f"tensor '{arg.name}' (a device pointer)",
            "tensor_map": f"a tensor map of '{arg.name}' (a CUtensorMap, by value)",
        }.get(arg.kind, f"'{arg.name}' as {arg.scalar_type}")
        head = f"parameter {index} '{parameter.name}' ({parameter.declared}) receives {passed}"
        message = ""
        if parameter.kind == "other":
            message = f"{head}: {parameter.why}"
        elif arg.kind == "tensor_map" and parameter.kind != "map":
            message = f"{head}: declare it `{MAP_DECLARATION} {parameter.name}`"
        elif parameter.kind == "map" and arg.kind != "tensor_map":
            message = f"{head}: a map parameter receives one of the plan's tensor_maps"
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
