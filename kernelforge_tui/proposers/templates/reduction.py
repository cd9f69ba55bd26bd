"""Reductions to one value: out[0] = finish(sum over i of term(...)), math in fp32, one launch; and reductions of
each row to one value (RowReductionTemplate).

The operation is read from the card's reference function or name; each OPS entry says what one term reads:
- an element of each input (dot_product: sum of a * b; mse_loss: mean of (a - b)^2; hinge_loss: mean of
  max(0, 1 - a * b)): the inputs all of one shape;
- a point, the input's last dimension (monte_carlo_integration: the mean of exp(-|p|^2) over the points [n, d]);
- an element and its column, with one output per row (simpson_integration: f [rows, m + 1] -> integral [rows],
  the weights 1, 4, 2, ..., 4, 1 by column, the sum times h / 3 = 1 / (3 m)).
The output is one element (a row reduction: one per row), one dtype throughout.

Why no atomics and no grid-wide counter: the output is poisoned before every launch (accumulating into it is
wrong), a card gives no zeroed scratch memory, and a module-scope counter reset by the last block breaks as soon
as the same kernel runs twice at once (two streams, a packaged model's threads). So the blocks that share the
work are one thread block cluster (Hopper, sm_90): each block reduces its share, then block 0 adds the others'
sums through distributed shared memory. Stateless, deterministic (fixed order), one launch.

Parameters: `blocks` (1: a single block; 2, 4, 8: one cluster of that many blocks, each on its own SM; 8 is
the portable cluster limit), `block` (threads), `vec` (elements per 16-byte-or-less load, a whole number of points
for point terms; leftover terms go through a scalar tail), `unroll` (vector chunks per thread per step, each with
its own accumulator, all loads issued before the math). The row reductions have their own (RowReductionTemplate).
The kernels are cuda/reduce_total.cu and cuda/reduce_rows.cu.
"""

from __future__ import annotations

from typing import ClassVar, Literal, NamedTuple

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    prelude_values,
    reduce_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.elementwise import operation_in
from kernelforge_tui.proposers.templates.source import render


class Reduction(NamedTuple):
    """One reduction: how many inputs, the result from the sum (a C expression of `total`, `n` the number of terms
    and, per row, `cols`), and what a term reads (`over`): one element of each input (float a0, a1), one point of
    the input (const float* a0 over its WIDTH coordinates), or one element a0 of a row at column i of cols (one
    output per row). Its fp32 term is the op's piece of cuda/reduce_terms.cuh."""

    arity: int
    finish: str
    over: Literal["elements", "points", "rows"] = "elements"


OPS: dict[str, Reduction] = {
    "dot_product": Reduction(2, "{total}"),
    "mse_loss": Reduction(2, "{total} / (float)n"),
    "hinge_loss": Reduction(2, "{total} / (float)n"),
    "monte_carlo_integration": Reduction(1, "{total} / (float)n", over="points"),
    "simpson_integration": Reduction(1, "{total} / (3.0f * (float)(cols - 1))", over="rows"),  # Simpson's h / 3
}


def term_values(op: str) -> dict[str, bool]:
    """The values that pick the op's term in cuda/reduce_terms.cuh."""
    return {name: name == op for name in OPS}


LOADED_FLOATS_PER_BLOCK = 32 * 1024
"""Loaded values a block may hold in flight: half of the 64K registers, so a 1024-thread block keeps 32 a thread
(more spilled: ptxas put 116 bytes on the stack for 64 at 1024 threads)."""


def operation(card: OperatorCard) -> str | None:
    """The OPS name in the reference function, else in the card name."""
    return operation_in((card.reference.function or "", card.name), OPS)


def _common_problem(card: OperatorCard, per_row: bool) -> str | None:
    """Why the card is not a reduction of the template's kind (to one value, or one per row), or None."""
    op = operation(card)
    if op is None:
        return f"no known reduction in {card.name!r} (known: {', '.join(OPS)})"
    reduction = OPS[op]
    if (reduction.over == "rows") != per_row:
        return f"{op} reduces {'each row' if reduction.over == 'rows' else 'everything'} to one value"
    if len(card.inputs) != reduction.arity or len(card.outputs) != 1:
        return f"{op} takes {reduction.arity} inputs and one output"
    tensors = [*card.inputs, card.outputs[0]]
    if len({t.dtype for t in tensors}) != 1 or tensors[0].dtype not in C_TYPE:
        return f"expects one dtype among {sorted(C_TYPE)}"
    shape = card.inputs[0].dims(card.sizes)
    if any(t.dims(card.sizes) != shape for t in card.inputs):
        return "inputs must have one shape"
    return None


def _product(dims: list[str]) -> str:
    return " * ".join(f"({dim})" for dim in dims) or "1"


class ReductionParams(TemplateParams):
    blocks: int
    block: int
    vec: int
    unroll: int


class ReductionTemplate(Template[ReductionParams]):
    name = "reduction"
    families = ("reduction",)
    entry = "kf_reduction"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("vec", "up", "wider accesses"),
            Lever("blocks", "up", "more SMs reading"),
        ),
        "memory_latency": (
            Lever("blocks", "up", "more SMs reading"),
            Lever("unroll", "up", "more loads in flight"),
            Lever("block", "up", "more threads reading"),
        ),
        "compute": (
            Lever("vec", "up", "fewer instructions per term"),
            Lever("unroll", "up", "independent accumulators"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        problem = _common_problem(card, per_row=False)
        if problem is not None:
            return problem
        if card.outputs[0].numel(card.sizes) != 1:
            return "the output must be one element (a full reduction)"
        width = self._width(card)
        if not any(v % width == 0 for v in vec_widths(dtype_of(card))):
            return f"a point of {width} coordinates does not fit a 16-byte load"
        return None

    def _width(self, card: OperatorCard) -> int:
        """Elements per term: 1, or a point's coordinates (the input's last dimension)."""
        op = operation(card)
        assert op is not None
        return card.inputs[0].dims(card.sizes)[-1] if OPS[op].over == "points" else 1

    def space(self, card: OperatorCard) -> Space:
        return {
            "blocks": (1, 2, 4, 8),
            "block": (256, 512, 1024),
            "vec": vec_widths(dtype_of(card)),
            "unroll": (1, 2, 4),
        }

    def params_type(self, card: OperatorCard) -> type[ReductionParams]:
        return ReductionParams

    def problem(self, card: OperatorCard, params: ReductionParams) -> str | None:
        """Every combination is correct for any n, but a load must hold whole points and registers are finite."""
        op = operation(card)
        assert op is not None
        if params.vec % (width := self._width(card)):
            return f"vec {params.vec} does not hold whole points of {width} coordinates"
        held = OPS[op].arity * params.unroll * params.vec
        if held * params.block > LOADED_FLOATS_PER_BLOCK:
            return f"{held} loaded floats per thread x {params.block} threads would spill registers"
        return None

    def _count(self, card: OperatorCard) -> str:
        """The number of terms: the inputs' elements, or their points."""
        shape = [str(dim) for dim in card.inputs[0].shape]
        return _product(shape[:-1] if self._width(card) > 1 else shape)

    def render(self, card: OperatorCard, params: ReductionParams) -> tuple[str, LaunchPlan]:
        op = operation(card)
        assert op is not None
        arity, finish, _ = OPS[op]
        dtype = dtype_of(card)
        width = self._width(card)
        blocks, block, vec, unroll = params.blocks, params.block, params.vec, params.unroll
        names = [t.name for t in card.inputs]
        out = card.outputs[0].name
        signature = ", ".join([*(f"const T* __restrict__ {n}" for n in names), f"T* __restrict__ {out}", "long long n"])
        strategy = "one block" if blocks == 1 else f"one cluster of {blocks} blocks"
        source = render(
            "reduce_total.cu",
            **prelude_values(dtype, vec),
            **reduce_values(False),
            op=op,
            dtype=dtype,
            strategy=strategy,
            block=block,
            unroll=unroll,
            terms="elements" if width == 1 else f"points of {width}",
            cluster=blocks > 1,
            cluster_attr=f"__attribute__((cluster_dims({blocks}, 1, 1))) " if blocks > 1 else "",
            blocks=blocks,
            width=width,
            **term_values(op),
            points=width > 1,
            binary=arity == 2,
            in0=names[0],
            in1=names[-1],
            signature=signature,
            out=out,
            finish=finish.format(total="total"),
            cluster_finish=finish.format(total="cluster_total"),
        )
        plan = LaunchPlan(
            entry=self.entry, grid=[blocks], block=[block], args=[*names, out, f"{self._count(card)}:i64"]
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        vec = max(vec_widths(dtype_of(card)))
        base: Params = {"blocks": 8, "block": 1024, "vec": vec, "unroll": 2}
        return [
            base,
            {**base, "blocks": 1, "block": 512, "unroll": 4},
            {**base, "blocks": 4, "block": 256, "unroll": 4},
            {**base, "blocks": 1, "unroll": 1},
            {**base, "blocks": 2, "vec": 1, "unroll": 4},
        ]


class RowReductionParams(TemplateParams):
    tpr: int
    block: int
    unroll: int


class RowReductionTemplate(Template[RowReductionParams]):
    """Each row of x [rows, cols] to one value: y[r] = finish(sum over i of term(x[r, i], i)).

    TPR consecutive threads share a row (a warp's loads of it coalesce; TPR 1 is a thread per row), each summing
    every TPR-th element with UNROLL independent loads and accumulators in flight, then a shuffle reduction (and
    shared memory past a warp). Rows may start anywhere (simpson's rows hold m + 1 = 257 elements), so loads are
    scalar; every parameter combination is correct for any size. Parameters: `tpr`, `block`, `unroll`.
    """

    name = "row_reduction"
    families = ("reduction",)
    entry = "kf_row_reduction"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (Lever("tpr", "up", "a row's loads coalesce across more lanes"),),
        "memory_latency": (
            Lever("unroll", "up", "more loads in flight"),
            Lever("block", "any", "block size"),
            Lever("tpr", "any", "threads per row"),
        ),
        "compute": (Lever("unroll", "up", "independent accumulators"),),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        problem = _common_problem(card, per_row=True)
        if problem is not None:
            return problem
        x, y = card.inputs[0].dims(card.sizes), card.outputs[0].dims(card.sizes)
        if len(x) < 2 or x[:-1] != y:
            return f"expects x [..., cols] -> y [...] (one value per row), card has {list(x)} -> {list(y)}"
        return None

    def space(self, card: OperatorCard) -> Space:
        return {"tpr": (1, 2, 4, 8, 16, 32, 64, 128, 256), "block": (64, 128, 256, 512, 1024), "unroll": (1, 2, 4, 8)}

    def params_type(self, card: OperatorCard) -> type[RowReductionParams]:
        return RowReductionParams

    def problem(self, card: OperatorCard, params: RowReductionParams) -> str | None:
        tpr, cols = params.tpr, card.inputs[0].dims(card.sizes)[-1]
        if tpr > params.block:
            return f"{tpr} threads per row exceed the block of {params.block}"
        if tpr > cols:
            return f"{tpr} threads per row exceed its {cols} elements"
        return None

    def render(self, card: OperatorCard, params: RowReductionParams) -> tuple[str, LaunchPlan]:
        op = operation(card)
        assert op is not None
        finish = OPS[op].finish
        dtype = dtype_of(card)
        tpr, block, unroll = params.tpr, params.block, params.unroll
        x, y = card.inputs[0].name, card.outputs[0].name
        source = render(
            "reduce_rows.cu",
            **prelude_values(dtype, 1),
            **reduce_values(False),
            op=op,
            dtype=dtype,
            tpr=tpr,
            unroll=unroll,
            block=block,
            **term_values(op),
            x=x,
            y=y,
            finish=finish.format(total="total"),
        )
        rows = _product([str(dim) for dim in card.outputs[0].shape])
        plan = LaunchPlan(
            entry=self.entry,
            grid=[f"cdiv({rows}, {block // tpr})"],
            block=[block],
            args=[x, y, f"{rows}:i64", str(card.inputs[0].shape[-1])],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        return [
            {"tpr": 32, "block": 256, "unroll": 4},
            {"tpr": 8, "block": 256, "unroll": 8},
            {"tpr": 128, "block": 512, "unroll": 2},
            {"tpr": 1, "block": 128, "unroll": 8},
        ]
