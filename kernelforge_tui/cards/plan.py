"""Resolve a LaunchPlan against a card into concrete numbers, rejecting impossible launches early."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from kernelforge_tui.cards import expr
from kernelforge_tui.cards.errors import CardError, from_validation_error, read_toml
from kernelforge_tui.cards.model import SCALAR_TYPES, LaunchPlan, OperatorCard

MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 227 * 1024
"""Hopper's limit for dynamic shared memory per block (opt-in above 48 KiB)."""


class ResolvedArg(BaseModel):
    """One kernel parameter with its concrete value."""

    kind: Literal["tensor", "scalar"]
    name: str
    scalar_type: str = ""
    value: int = 0


class ResolvedLaunch(BaseModel):
    """Grid, block, shared memory and arguments as numbers: what the worker launches."""

    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: list[ResolvedArg]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


def _dims(values: list[str | int], sizes: dict[str, int], field: str) -> tuple[int, int, int]:
    numbers = [expr.evaluate(v, sizes) for v in values]
    numbers += [1] * (3 - len(numbers))
    if any(n <= 0 for n in numbers):
        raise expr.ExprError(f"{field} evaluates to {tuple(numbers)}: every dimension must be >= 1")
    return numbers[0], numbers[1], numbers[2]


def _arg(text: str, card: OperatorCard) -> ResolvedArg:
    tensors = {t.name for t in [*card.inputs, *card.outputs]}
    if text in tensors:
        return ResolvedArg(kind="tensor", name=text)
    formula, _, suffix = text.partition(":") if ":" in text else (text, "", "i32")
    if suffix not in SCALAR_TYPES:
        raise expr.ExprError(f"argument {text!r}: type suffix must be one of {sorted(SCALAR_TYPES)}")
    value = expr.evaluate(formula, card.sizes)
    kind = SCALAR_TYPES[suffix]
    if kind.startswith("int"):
        bits = int(kind[3:])
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise expr.ExprError(f"argument {text!r} = {value} does not fit {kind}; use ':i64'")
    elif kind.startswith("uint") and not 0 <= value < 2 ** int(kind[4:]):
        raise expr.ExprError(f"argument {text!r} = {value} does not fit {kind}")
    return ResolvedArg(kind="scalar", name=formula.strip(), scalar_type=kind, value=value)


def resolve(plan: LaunchPlan, card: OperatorCard) -> ResolvedLaunch:
    """Evaluate the plan over the card's sizes; ExprError names the field and the fix."""
    try:
        grid = _dims(plan.grid, card.sizes, "grid")
        block = _dims(plan.block, card.sizes, "block")
        shared = expr.evaluate(plan.shared_bytes, card.sizes)
    except expr.ExprError as exc:
        raise expr.ExprError(f"plan for {plan.entry}: {exc}") from None
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS_PER_BLOCK or any(b > m for b, m in zip(block, MAX_BLOCK_DIM, strict=True)):
        raise expr.ExprError(f"block {block} exceeds the limit of {MAX_THREADS_PER_BLOCK} threads per block")
    if any(g > m for g, m in zip(grid, MAX_GRID_DIM, strict=True)):
        raise expr.ExprError(f"grid {grid} exceeds the limits {MAX_GRID_DIM}")
    if not 0 <= shared <= MAX_SHARED_BYTES:
        raise expr.ExprError(f"shared_bytes = {shared} must be within 0..{MAX_SHARED_BYTES}")
    args = [_arg(a, card) for a in plan.args]
    return ResolvedLaunch(entry=plan.entry, grid=grid, block=block, shared_bytes=shared, args=args)


def load_plan(path: Path) -> LaunchPlan:
    """Read a plan TOML file (the fields of LaunchPlan at top level)."""
    data = read_toml(path, "write a plan TOML with entry, grid, block, args")
    try:
        return LaunchPlan.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(path, exc) from None


def plan_for_kernel(kernel: Path, explicit: Path | None = None) -> LaunchPlan:
    """The plan given, else `<kernel>.plan.toml` beside the kernel (`softmax_v2.cu` -> `softmax_v2.plan.toml`)."""
    path = explicit or kernel.with_suffix(".plan.toml")
    if not path.exists():
        raise CardError(path, None, "no launch plan for this kernel", f"pass --plan or write {path.name}")
    return load_plan(path)
