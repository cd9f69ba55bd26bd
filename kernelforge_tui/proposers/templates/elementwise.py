"""Elementwise maps over flat tensors: out = f(in0[, in1]) element by element, math in fp32.

The operation is read from the card's reference function or name (vector_add -> add, gelu, silu,
silu_mul for silu(gate) * up, leaky_relu, elu, selu, sigmoid, row_tanh -> tanh, ...); inputs are the
card's inputs in order, the output its first output, all one dtype; the element count is the product of
the output's shape. Each input is read in one of three layouts:
- streamed: the output's shape, chunk i of it feeds chunk i of the output;
- scalar: one element (matrix_scalar_mul's `s`), read once per thread and used for every element;
- split: vLLM's `*_and_mul` ops take one input x [..., 2 h] for an output [..., h]: output column j of a row
  is f(x[row, j], x[row, h + j]).

Parameters: `vec` (elements per 16-byte-or-less access; n % vec leftovers go through a scalar tail),
`block`, `unroll` (vector chunks per thread per step, loads issued before math), `loop` (grid_stride
over a grid of `waves` x 132 SMs worth of blocks, or one_per_thread with a grid covering n), `minb`, and
`fast_math` for ops with a fast form (FAST_FORMS) that the card's tolerance admits.

The kernel is cuda/elementwise.cu; a fast form's helpers are a shared file (cuda/fast_phi.cuh).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import ClassVar, Literal, NamedTuple

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    FAST_MATH_MIN_RTOL,
    SM_COUNT,
    STREAMING_LEVERS,
    Lever,
    Levers,
    Params,
    Space,
    StreamingParams,
    Template,
    dtype_of,
    prelude_values,
    streaming_canonical,
    streaming_loop,
    streaming_problem,
    streaming_space,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import render

OPS: dict[str, tuple[int, str]] = {
    "silu_mul": (2, "a0 / (1.0f + expf(-a0)) * a1"),
    "silu_and_mul": (2, "a0 / (1.0f + expf(-a0)) * a1"),  # split layout: one input [..., 2 h]
    "swiglu": (2, "a0 / (1.0f + expf(-a0)) * a1"),
    "add": (2, "a0 + a1"),
    "sub": (2, "a0 - a1"),
    "mul": (2, "a0 * a1"),
    "gelu_tanh": (1, "0.5f * a0 * (1.0f + tanhf(0.7978845608f * (a0 + 0.044715f * a0 * a0 * a0)))"),
    "gelu": (1, "0.5f * a0 * (1.0f + erff(a0 * 0.7071067812f))"),
    "silu": (1, "a0 / (1.0f + expf(-a0))"),
    "relu": (1, "(a0 > 0.0f || a0 != a0) ? a0 : 0.0f"),  # NaN stays NaN, as torch.relu keeps it
    "leaky_relu": (1, "a0 > 0.0f ? a0 : 0.01f * a0"),  # torch's default negative slope
    "elu": (1, "a0 > 0.0f ? a0 : expm1f(a0)"),  # alpha 1, torch's default
    "selu": (1, "1.0507009873554805f * (a0 > 0.0f ? a0 : 1.6732632423543772f * expm1f(a0))"),  # torch's constants
    "sigmoid": (1, "1.0f / (1.0f + expf(-a0))"),  # saturates to 0 and 1: exp overflows to inf, 1 / inf = 0
    "tanh": (1, "tanhf(a0)"),
}
"""Operation name -> (arity, fp32 expression over a0, a1). NaN propagates through each (a comparison that is false
for NaN picks the branch that carries it)."""
SPLIT_OPS = frozenset({"silu_and_mul"})
"""Ops whose two operands are the halves of one input's rows (vLLM's act_and_mul layout), and only those."""


class Operand(NamedTuple):
    """Where operand a<k> comes from: `name`'s chunk i (stream), `name`[0] (scalar), or the first or second half of
    `name`'s row (gate, up: the split layout)."""

    name: str
    layout: Literal["stream", "scalar", "gate", "up"]


def operation_in(texts: Iterable[str], names: Iterable[str]) -> str | None:
    """The longest of `names` standing as a word of the first text that has one.

    A word is bounded by the text's ends or by characters other than letters and digits (`_` and `.` separate:
    `leaky_relu_fp32_s14`, `torch.tanh`). Longest first, so that `leaky_relu` wins over the `relu` inside it and
    `gelu_tanh` over `gelu`; bounded, so that `selu` never reads as `elu` and `relu6` not as `relu`.
    """
    longest = sorted(names, key=len, reverse=True)
    for text in texts:
        for name in longest:
            if re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", text):
                return name
    return None


def operation(card: OperatorCard) -> str | None:
    """The OPS name in the reference function, else in the card name."""
    return operation_in((card.reference.function or "", card.name), OPS)


def operands(card: OperatorCard) -> list[Operand] | str:
    """How each operand of the card's operation is read, or why the card's tensors do not fit the operation."""
    op = operation(card)
    if op is None:
        return f"no known elementwise operation in {card.name!r} (known: {', '.join(OPS)})"
    arity = OPS[op][0]
    tensors = [*card.inputs, card.outputs[0]]
    if len({t.dtype for t in tensors}) != 1 or tensors[0].dtype not in C_TYPE:
        return f"expects one dtype among {sorted(C_TYPE)}"
    if len(card.outputs) != 1:
        return f"{op} has one output"
    shape = card.outputs[0].dims(card.sizes)
    if op in SPLIT_OPS:
        if len(card.inputs) != 1:
            return f"{op} takes one input x [..., 2 h] for an output [..., h]"
        x = card.inputs[0].dims(card.sizes)
        if not shape or x != (*shape[:-1], 2 * shape[-1]):
            return f"{op} takes x [..., 2 h] for an output [..., h], card has {list(x)} -> {list(shape)}"
        name = card.inputs[0].name
        return [Operand(name, "gate"), Operand(name, "up")]
    if len(card.inputs) != arity:
        return f"{op} takes {arity} inputs and one output"
    found = [
        Operand(t.name, "stream" if t.dims(card.sizes) == shape else "scalar")
        for t in card.inputs
        if t.dims(card.sizes) == shape or t.numel(card.sizes) == 1
    ]
    if len(found) != arity or all(o.layout == "scalar" for o in found):
        return "inputs must have the output's shape, or be one element (a scalar), and one must have its shape"
    return found


class FastForm(NamedTuple):
    """An op's expression with fast intrinsics, the shared file (cuda/NAME.cuh) of the helpers it calls, and the
    least atol its error needs."""

    expression: str
    helpers: str = ""
    min_atol: float = 0.0


FAST_FORMS: dict[str, FastForm] = {
    # |gelu error| <= 0.21 of 1e-6 + 1e-5 |y| over [-12, 12] (worst near x = -3.1: 0.5 |x| * erfc's 1.5e-7); a card
    # whose atol is under 1e-6 (a captured fp32 card's 1e-8) would hold the kernel to float32's own cancelling erf.
    "gelu": FastForm("a0 * fast_phi(a0)", "fast_phi.cuh", 1e-6),
}
"""Ops with a fast form: a compute-heavy map (gelu's erff is ~25 instructions an element) then streams at the
memory's pace instead of the issue rate's. __expf and __fdividef err by a few ulp (FAST_MATH_MIN_RTOL); a form is
offered only where every output's rtol is at least that and its atol at least `min_atol`. silu has none: its exact
value near x = -88, about 1e-37, times a large `up` is visible, and __fdividef gives 0 for a divisor past 2^126 (the
H200's captured silu(gate)*up card failed stress:large so)."""


def fast_form(card: OperatorCard) -> FastForm | None:
    """The card's op's fast form, when it has one that the card's tolerance admits."""
    form = FAST_FORMS.get(operation(card) or "")
    if form is None:
        return None
    tolerances = [out.effective_tolerance() for out in card.outputs]
    if all(t.rtol >= FAST_MATH_MIN_RTOL and t.atol >= form.min_atol for t in tolerances):
        return form
    return None


class ElementwiseParams(StreamingParams):
    fast_math: int | None = None
    """1: the op's fast form (only in the space of a card whose op has one its tolerance admits)."""


class ElementwiseTemplate(Template[ElementwiseParams]):
    name = "elementwise"
    families = ("elementwise",)
    entry = "kf_elementwise"
    levers: ClassVar[Levers] = {
        **STREAMING_LEVERS,
        "compute": (Lever("fast_math", "up", "fast math intrinsics"), *STREAMING_LEVERS["compute"]),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        found = operands(card)
        return found if isinstance(found, str) else None

    def params_type(self, card: OperatorCard) -> type[ElementwiseParams]:
        return ElementwiseParams

    def space(self, card: OperatorCard) -> Space:
        return streaming_space(card) | ({"fast_math": (0, 1)} if fast_form(card) else {})

    def canonical(self, card: OperatorCard, params: ElementwiseParams) -> ElementwiseParams:
        return streaming_canonical(params)

    def problem(self, card: OperatorCard, params: ElementwiseParams) -> str | None:
        if operation(card) in SPLIT_OPS and (half := card.outputs[0].dims(card.sizes)[-1]) % params.vec:
            return f"vec {params.vec} does not divide the half row h = {half} (a chunk would span two rows)"
        if params.fast_math and fast_form(card) is None:
            return "fast_math: the op has no fast form, or the card's tolerance is tighter than its error"
        return streaming_problem(params)

    def _count(self, card: OperatorCard) -> str:
        return " * ".join(f"({dim})" for dim in card.outputs[0].shape)

    def render(self, card: OperatorCard, params: ElementwiseParams) -> tuple[str, LaunchPlan]:
        op = operation(card)
        assert op is not None
        form = fast_form(card) if params.fast_math else None
        expression = form.expression if form else OPS[op][1]
        found = operands(card)
        assert not isinstance(found, str)
        dtype = dtype_of(card)
        vec, block, unroll = params.vec, params.block, params.unroll
        names = list(dict.fromkeys(o.name for o in found))  # the split layout's x once
        out = card.outputs[0].name
        split = found[0].layout == "gate"
        signature = ", ".join(
            [*(f"const T* __restrict__ {n}" for n in names), f"T* __restrict__ {out}", "long long n"]
            + (["int half"] if split else [])
        )
        layouts = [o.layout for o in found]
        grid_stride = params.loop == "grid_stride"
        source = render(
            "elementwise.cu",
            **prelude_values(dtype, vec),
            what=f"{op} ({dtype}{', fast math' if form else ''})",
            unroll=unroll,
            loop=streaming_loop(params),
            layouts=", ".join(f"a{k} {o.layout} {o.name}" for k, o in enumerate(found)),
            block=block,
            minb=params.minb,
            helpers=render(form.helpers) if form and form.helpers else "",
            expression=expression,
            signature=signature,
            in0=found[0].name,
            in1=found[-1].name,
            unary=len(found) == 1,
            streams=layouts == ["stream", "stream"],
            pair=layouts in (["stream", "stream"], ["gate", "up"]),
            split=split,
            scalar0=layouts[0] == "scalar",
            scalar1=layouts[1:] == ["scalar"],
            streamed0=layouts[0] != "scalar",
            streamed1=len(layouts) == 2 and layouts[1] != "scalar",
            grid_stride=grid_stride,
            out=out,
        )
        count = self._count(card)
        chunks = f"cdiv({count}, {block * vec * unroll})"
        grid = f"min({chunks}, {SM_COUNT * params.waves * params.minb})" if grid_stride else chunks
        half = [str(card.outputs[0].shape[-1])] if split else []
        plan = LaunchPlan(entry=self.entry, grid=[grid], block=[block], args=[*names, out, f"{count}:i64", *half])
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        vec = max(vec_widths(dtype_of(card)))
        fast: Params = {"fast_math": 1} if fast_form(card) else {}
        base: Params = {"vec": vec, "block": 256, "unroll": 1, "loop": "grid_stride", "waves": 4, "minb": 1, **fast}
        seeds = [
            base,
            {**base, "unroll": 2, "block": 512, "waves": 2, "minb": 2},
            {**base, "loop": "one_per_thread", "waves": 1},
            {**base, "loop": "one_per_thread", "waves": 1, "unroll": 4, "block": 128},
            {**base, "vec": 1, "block": 1024, "waves": 2},
        ]
        return seeds + ([{**base, "fast_math": 0}] if fast else [])
