"""Resolve a LaunchPlan against a card into concrete numbers, rejecting impossible launches early."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from kernelforge_tui.cards import expr
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.errors import CardError, from_validation_error, read_toml
from kernelforge_tui.cards.model import SCALAR_TYPES, LaunchPlan, OperatorCard, TensorMapSpec
from kernelforge_tui.errors import FieldError
from kernelforge_tui.tensor_maps import (
    MAX_BOX,
    MAX_TMA_DIM,
    TMA_ALIGNMENT,
    TMA_DATA_TYPES,
    TMA_L2_PROMOTION,
    TMA_SWIZZLE,
    TensorMap,
)

MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 227 * 1024
"""Hopper's limit for dynamic shared memory per block (opt-in above 48 KiB)."""


class ResolvedArg(BaseModel):
    """One kernel parameter with its concrete value."""

    kind: Literal["tensor", "scalar", "tensor_map"]
    name: str
    """The tensor (of a tensor or a tensor map), or the scalar's formula."""
    scalar_type: str = ""
    value: int = 0
    tensor_map: TensorMap | None = None


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


class PlanError(FieldError, expr.ExprError):
    """A launch plan that does not fit its card, at a named field (`grid.0`, `args.2`) with the fix: bad input
    wherever the plan came from (a plan file, the card's baseline, a proposer's reply)."""

    def __init__(self, entry: str, field: str, problem: str, fix: str) -> None:
        super().__init__(f"plan for {entry}", field, problem, fix)


def _value(plan: LaunchPlan, field: str, value: str | int, sizes: dict[str, int]) -> int:
    try:
        return expr.evaluate(value, sizes)
    except expr.ExprError as exc:
        known = ", ".join(sorted(sizes)) or "none"
        raise PlanError(
            plan.entry, field, str(exc), f"write an integer formula over the card's sizes ({known})"
        ) from None


def _dims(plan: LaunchPlan, field: str, values: list[str | int], sizes: dict[str, int]) -> tuple[int, int, int]:
    numbers = [_value(plan, f"{field}.{i}", v, sizes) for i, v in enumerate(values)]
    numbers += [1] * (3 - len(numbers))
    if any(n <= 0 for n in numbers):
        raise PlanError(plan.entry, field, f"evaluates to {tuple(numbers)}", "make every dimension >= 1")
    return numbers[0], numbers[1], numbers[2]


def tensor_map(plan: LaunchPlan, name: str, spec: TensorMapSpec, card: OperatorCard) -> TensorMap:
    """The map `name` of the plan over its tensor: extent and strides from the card, never from the plan; PlanError
    for a box, swizzle or tensor the TMA cannot take."""
    field = f"tensor_maps.{name}"
    tensors = {t.name: t for t in [*card.inputs, *card.outputs]}
    tensor = tensors.get(spec.tensor)
    if tensor is None:
        raise PlanError(
            plan.entry,
            f"{field}.tensor",
            f"{spec.tensor!r} is not a tensor of the card",
            f"map one of {sorted(tensors)}",
        )
    if tensor.dtype not in TMA_DATA_TYPES:
        raise PlanError(
            plan.entry,
            f"{field}.tensor",
            f"a TMA copies no {tensor.dtype}",
            f"map a tensor of {sorted(TMA_DATA_TYPES)}",
        )
    shape = tensor.dims(card.sizes)[::-1] or (1,)
    if len(spec.box) < len(shape):
        raise PlanError(
            plan.entry,
            f"{field}.box",
            f"{len(spec.box)} dims for a tensor of rank {len(shape)}",
            f"give one box size per dim of {spec.tensor}, innermost first (its extent that way is {list(shape)})",
        )
    if any(not 1 <= b <= MAX_BOX for b in spec.box):
        raise PlanError(
            plan.entry,
            f"{field}.box",
            f"{spec.box} has a size outside 1..{MAX_BOX}",
            "split the copy into boxes of at most 256",
        )
    element = NUMPY[tensor.dtype].itemsize
    inner = spec.box[0] * element
    if inner % TMA_ALIGNMENT:
        raise PlanError(
            plan.entry, f"{field}.box.0", f"the inner row of a box is {inner} bytes", "make it a multiple of 16 bytes"
        )
    if spec.swizzle and inner > spec.swizzle:
        raise PlanError(
            plan.entry,
            f"{field}.box.0",
            f"the inner row of a box is {inner} bytes, wider than the {spec.swizzle}-byte swizzle",
            f"copy at most {spec.swizzle // element} elements per row, or swizzle wider",
        )
    if max(shape) > MAX_TMA_DIM:
        raise PlanError(plan.entry, field, f"{spec.tensor} has a dim over 2**32 elements", "copy it without TMA")
    dims = [*shape, *[1] * (len(spec.box) - len(shape))]
    strides: list[int] = []
    step = element
    for dim in dims[:-1]:
        step *= dim
        strides.append(step)
    for k, stride in enumerate(strides[: len(shape) - 1]):
        if stride % TMA_ALIGNMENT:
            raise PlanError(
                plan.entry,
                field,
                f"{spec.tensor}'s dim {k + 1} (innermost first) has a stride of {stride} bytes",
                "a TMA map needs strides that are multiples of 16 bytes: refuse the card or copy without TMA",
            )
    strides = [-(-s // TMA_ALIGNMENT) * TMA_ALIGNMENT for s in strides]  # an outer dim of extent 1 moves nowhere
    return TensorMap(
        tensor=spec.tensor,
        data_type=TMA_DATA_TYPES[tensor.dtype],
        element_bytes=element,
        dims=tuple(dims),
        strides=tuple(strides),
        box=tuple(spec.box),
        swizzle=TMA_SWIZZLE[spec.swizzle],
        l2_promotion=TMA_L2_PROMOTION[spec.l2_promotion],
    )


def _arg(plan: LaunchPlan, index: int, card: OperatorCard) -> ResolvedArg:
    text = plan.args[index]
    field = f"args.{index}"
    tensors = [t.name for t in [*card.inputs, *card.outputs]]
    if text in tensors:
        return ResolvedArg(kind="tensor", name=text)
    if text in plan.tensor_maps:
        made = tensor_map(plan, text, plan.tensor_maps[text], card)
        return ResolvedArg(kind="tensor_map", name=made.tensor, tensor_map=made)
    formula, _, suffix = text.partition(":") if ":" in text else (text, "", "i32")
    if suffix not in SCALAR_TYPES:
        raise PlanError(
            plan.entry, field, f"{text!r} has the type suffix {suffix!r}", f"use one of {sorted(SCALAR_TYPES)}"
        )
    try:
        unknown = sorted(expr.names(formula) - set(card.sizes))
    except expr.ExprError as exc:
        raise PlanError(plan.entry, field, str(exc), expr.HELP) from None
    if unknown:
        raise PlanError(
            plan.entry,
            field,
            f"{text!r} is neither a tensor of the card nor a formula over its sizes (unknown: {', '.join(unknown)})",
            f"pass a tensor ({', '.join(tensors)}) or a formula over the sizes ({', '.join(sorted(card.sizes))})",
        )
    value = _value(plan, field, formula, card.sizes)
    kind = SCALAR_TYPES[suffix]
    if kind.startswith("int"):
        bits = int(kind[3:])
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise PlanError(plan.entry, field, f"{text!r} = {value} does not fit {kind}", "use ':i64'")
    elif kind.startswith("uint") and not 0 <= value < 2 ** int(kind[4:]):
        raise PlanError(plan.entry, field, f"{text!r} = {value} does not fit {kind}", "pass a value in its range")
    return ResolvedArg(kind="scalar", name=formula.strip(), scalar_type=kind, value=value)


def resolve(plan: LaunchPlan, card: OperatorCard) -> ResolvedLaunch:
    """Evaluate the plan over the card's sizes; PlanError names the field and the fix."""
    grid = _dims(plan, "grid", plan.grid, card.sizes)
    block = _dims(plan, "block", plan.block, card.sizes)
    shared = _value(plan, "shared_bytes", plan.shared_bytes, card.sizes)
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS_PER_BLOCK or any(b > m for b, m in zip(block, MAX_BLOCK_DIM, strict=True)):
        raise PlanError(
            plan.entry,
            "block",
            f"{block} exceeds the limit of {MAX_THREADS_PER_BLOCK} threads per block",
            f"use at most {MAX_THREADS_PER_BLOCK} threads, and at most {MAX_BLOCK_DIM} in each dimension",
        )
    if any(g > m for g, m in zip(grid, MAX_GRID_DIM, strict=True)):
        raise PlanError(plan.entry, "grid", f"{grid} exceeds the limits {MAX_GRID_DIM}", "launch fewer blocks")
    if not 0 <= shared <= MAX_SHARED_BYTES:
        raise PlanError(
            plan.entry, "shared_bytes", f"{shared} is outside 0..{MAX_SHARED_BYTES}", "use less shared memory"
        )
    clash = sorted(set(plan.tensor_maps) & ({t.name for t in [*card.inputs, *card.outputs]} | set(card.sizes)))
    if clash:
        raise PlanError(plan.entry, "tensor_maps", f"{clash} name a tensor or size of the card", "name each map apart")
    unused = sorted(set(plan.tensor_maps) - set(plan.args))
    if unused:
        raise PlanError(plan.entry, "tensor_maps", f"{unused} are passed by no argument", "pass each map in args")
    args = [_arg(plan, i, card) for i in range(len(plan.args))]
    return ResolvedLaunch(entry=plan.entry, grid=grid, block=block, shared_bytes=shared, args=args)


def resolve_in(path: Path, plan: LaunchPlan, card: OperatorCard, field: str | None = None) -> ResolvedLaunch:
    """`resolve` for a plan read from a file (a plan file, or a card's `baseline.plan` at `field`): a plan that does
    not fit is a CardError naming that file and the field."""
    try:
        return resolve(plan, card)
    except PlanError as exc:
        where = ".".join(part for part in (field, exc.field) if part)
        raise CardError(path, where, exc.problem, exc.fix) from None


def load_plan(path: Path) -> LaunchPlan:
    """Read a plan TOML file (the fields of LaunchPlan at top level)."""
    data = read_toml(path, "write a plan TOML with entry, grid, block, args")
    try:
        return LaunchPlan.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(path, exc) from None


def plan_for_kernel(kernel: Path, explicit: Path | None = None, card: OperatorCard | None = None) -> LaunchPlan:
    """The plan given, else `<kernel>.plan.toml` beside the kernel (`softmax_v2.cu` -> `softmax_v2.plan.toml`);
    with `card`, checked to fit it (`resolve_in`)."""
    path = explicit or kernel.with_suffix(".plan.toml")
    if not path.exists():
        raise CardError(path, None, "no launch plan for this kernel", f"pass --plan or write {path.name}")
    plan = load_plan(path)
    if card is not None:
        resolve_in(path, plan, card)
    return plan
