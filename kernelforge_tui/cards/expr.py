"""A small, safe evaluator for integer expressions over a card's named sizes.

Launch plans and cost formulas are data written by users and by untrusted proposers, so they are
parsed with `ast` and walked over a short allow-list of nodes; nothing is ever passed to `eval`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping

from kernelforge_tui.errors import BadInput

MAX_LEN = 256
MAX_ABS = 2**63 - 1


class ExprError(BadInput, ValueError):
    """An expression that is not a plain integer formula over known sizes (a ValueError too: pydantic validators
    raise it)."""


def _cdiv(a: int, b: int) -> int:
    if b == 0:
        raise ExprError("division by zero in cdiv()")
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


FUNCTIONS: dict[str, tuple[int, Callable[..., int]]] = {
    "cdiv": (2, _cdiv),
    "round_up": (2, _round_up),
    "min": (2, min),
    "max": (2, max),
}
"""Functions an expression may call, with their arity."""

HELP = (
    "write an integer formula over the card's sizes with + - * / // % ** and parentheses, "
    "and the functions cdiv(a, b), round_up(a, b), min(a, b), max(a, b); '/' divides exactly "
    "(use cdiv for ceiling division)"
)


def _div(a: int, b: int, op: str) -> int:
    if b == 0:
        raise ExprError(f"division by zero ({a} {op} 0)")
    if op == "/" and a % b:
        raise ExprError(f"{a} / {b} is not an integer; use cdiv({a}, {b}) or {a} // {b}")
    return a // b


def _binop(op: ast.operator, a: int, b: int) -> int:
    if isinstance(op, ast.Add):
        return a + b
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if isinstance(op, ast.Div):
        return _div(a, b, "/")
    if isinstance(op, ast.FloorDiv):
        return _div(a, b, "//")
    if isinstance(op, ast.Mod):
        if b == 0:
            raise ExprError("modulo by zero")
        return a % b
    if isinstance(op, ast.Pow):
        if b < 0 or b > 64:
            raise ExprError(f"exponent {b} out of range 0..64")
        return int(a**b)
    raise ExprError(f"operator {type(op).__name__} is not allowed; {HELP}")


def _describe(node: ast.AST) -> str:
    """A readable name for a construct the evaluator refuses."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, float):
            return f"the float {node.value!r} (sizes and launch dimensions are integers)"
        if isinstance(node.value, str):
            return f"the string {node.value!r}"
        return f"the constant {node.value!r}"
    named = {
        ast.Attribute: "attribute access",
        ast.Subscript: "indexing",
        ast.Lambda: "a lambda",
        ast.Call: "a call of anything but cdiv/round_up/min/max, or with keyword arguments",
        ast.Compare: "a comparison",
        ast.BoolOp: "and/or",
        ast.IfExp: "a conditional expression",
        ast.NamedExpr: "an assignment",
    }
    for kind, text in named.items():
        if isinstance(node, kind):
            return text
    return f"{type(node).__name__} ({ast.unparse(node)[:40]!r})"


def _walk(node: ast.AST, sizes: Mapping[str, int]) -> int:
    if isinstance(node, ast.Expression):
        return _walk(node.body, sizes)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in sizes:
            known = ", ".join(sorted(sizes)) or "none"
            raise ExprError(f"unknown size {node.id!r} (known sizes: {known})")
        return int(sizes[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _walk(node.operand, sizes)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        result = _binop(node.op, _walk(node.left, sizes), _walk(node.right, sizes))
        if abs(result) > MAX_ABS:
            raise ExprError("value overflows 64 bits")
        return result
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        name = node.func.id
        if name not in FUNCTIONS:
            raise ExprError(f"function {name!r} is not allowed; {HELP}")
        arity, fn = FUNCTIONS[name]
        if len(node.args) != arity:
            raise ExprError(f"{name}() takes {arity} arguments, got {len(node.args)}")
        return int(fn(*(_walk(arg, sizes) for arg in node.args)))
    raise ExprError(f"{_describe(node)} is not allowed; {HELP}")


def parse(expr: str | int) -> ast.Expression:
    """Parse (and bound) an expression without evaluating it."""
    text = str(expr)
    if len(text) > MAX_LEN:
        raise ExprError(f"expression longer than {MAX_LEN} characters")
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse {text!r}: {exc.msg}; {HELP}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        raise ExprError(f"cannot parse {text!r}: {exc}; {HELP}") from None


def names(expr: str | int) -> set[str]:
    """The size names an expression refers to (function names excluded)."""
    tree = parse(expr)
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - called


def evaluate(expr: str | int, sizes: Mapping[str, int]) -> int:
    """The integer value of `expr` with `sizes` bound; ExprError says what is wrong and how to fix it."""
    if isinstance(expr, int) and not isinstance(expr, bool):
        return expr
    return _walk(parse(expr), sizes)
