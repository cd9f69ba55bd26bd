"""Elementwise maps over flat tensors: out = f(in0[, in1]) element by element, math in fp32.

The operation is read from the card's reference function or name (vector_add -> add, gelu, silu,
silu_mul for silu(gate) * up, leaky_relu, elu, selu, sigmoid, row_tanh -> tanh, ...); inputs are the
card's inputs in order, the output its first output, all one dtype and one shape; the element count is
the product of the output's shape.

Parameters: `vec` (elements per 16-byte-or-less access; n % vec leftovers go through a scalar tail),
`block`, `unroll` (vector chunks per thread per step, loads issued before math), `loop` (grid_stride
over a grid of `waves` x 132 SMs worth of blocks, or one_per_thread with a grid covering n), `minb`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    SM_COUNT,
    Params,
    Space,
    Template,
    dtype_of,
    launch_bounds,
    prelude,
    streaming_canonical,
    streaming_problem,
    streaming_space,
    vec_widths,
)

OPS: dict[str, tuple[int, str]] = {
    "silu_mul": (2, "a0 / (1.0f + expf(-a0)) * a1"),
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


class ElementwiseTemplate(Template):
    families = ("elementwise",)
    entry = "kf_elementwise"

    def unsupported(self, card: OperatorCard) -> str | None:
        op = operation(card)
        if op is None:
            return f"no known elementwise operation in {card.name!r} (known: {', '.join(OPS)})"
        arity = OPS[op][0]
        tensors = [*card.inputs, card.outputs[0]]
        if len(card.inputs) != arity or len(card.outputs) != 1:
            return f"{op} takes {arity} inputs and one output"
        if len({t.dtype for t in tensors}) != 1 or tensors[0].dtype not in C_TYPE:
            return f"expects one dtype among {sorted(C_TYPE)}"
        shape = card.outputs[0].dims(card.sizes)
        if any(t.dims(card.sizes) != shape for t in tensors):
            return "inputs and output must have one shape"
        return None

    def space(self, card: OperatorCard) -> Space:
        return streaming_space(card)

    def canonical(self, card: OperatorCard, params: Params) -> Params:
        return streaming_canonical(params)

    def problem(self, card: OperatorCard, params: Params) -> str | None:
        return streaming_problem(params)

    def _count(self, card: OperatorCard) -> str:
        return " * ".join(f"({dim})" for dim in card.outputs[0].shape)

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        op = operation(card)
        assert op is not None
        arity, expression = OPS[op]
        dtype = dtype_of(card)
        vec, block, unroll = int(params["vec"]), int(params["block"]), int(params["unroll"])
        names = [t.name for t in card.inputs]
        out = card.outputs[0].name
        signature = ", ".join([*(f"const T* __restrict__ {n}" for n in names), f"T* __restrict__ {out}", "long long n"])
        loads = "".join(f" load_chunk({n}, i, in{k}[u]);\n" for k, n in enumerate(names))
        decl = "".join(f"float in{k}[UNROLL][VEC];\n" for k in range(arity))
        args = ", ".join(f"in{k}[u][j]" for k in range(arity))
        scalar_args = ", ".join(f"to_f({n}[i])" for n in names)
        params_c = ", ".join(f"float a{k}" for k in range(arity))
        grid_stride = params["loop"] == "grid_stride"
        head = (
            "for (long long base = first; base < nvec; base += step) {\n"
            if grid_stride
            else "{\n const long long base = first;\n"
        )
        source = f"""// {op} ({dtype}): {vec}-element vectors, {unroll} per thread per step, {params["loop"]}.
// Generated by the template proposer.
{prelude(dtype, vec)}#define BLOCK {block}
#define UNROLL {unroll}

__device__ __forceinline__ float op({params_c}) {{ return {expression}; }}

extern "C" __global__ void {launch_bounds(block, int(params["minb"]))} {self.entry}({signature}) {{
const long long nvec = n / VEC;
const long long first = (long long)blockIdx.x * (BLOCK * UNROLL) + threadIdx.x;
const long long step = (long long)gridDim.x * (BLOCK * UNROLL);
{head}{decl}#pragma unroll
for (int u = 0; u < UNROLL; ++u) {{
 const long long i = base + (long long)u * BLOCK;
 if (i < nvec) {{
{loads} }}
}}
#pragma unroll
for (int u = 0; u < UNROLL; ++u) {{
 const long long i = base + (long long)u * BLOCK;
 if (i < nvec) {{
  float o[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {{
   o[j] = op({args});
  }}
  store_chunk({out}, i, o);
 }}
}}
}}
// The n % VEC leftover elements, one per thread of the first block.
const long long i = nvec * VEC + (long long)blockIdx.x * BLOCK + threadIdx.x;
if (blockIdx.x == 0 && i < n) {{
 {out}[i] = from_f(op({scalar_args}));
}}
}}
"""
        count = self._count(card)
        chunks = f"cdiv({count}, {block * vec * unroll})"
        grid = f"min({chunks}, {SM_COUNT * int(params['waves']) * int(params['minb'])})" if grid_stride else chunks
        plan = LaunchPlan(entry=self.entry, grid=[grid], block=[block], args=[*names, out, f"{count}:i64"])
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        vec = max(vec_widths(dtype_of(card)))
        base: Params = {"vec": vec, "block": 256, "unroll": 1, "loop": "grid_stride", "waves": 4, "minb": 1}
        return [
            base,
            {**base, "unroll": 2, "block": 512, "waves": 2, "minb": 2},
            {**base, "loop": "one_per_thread", "waves": 1},
            {**base, "loop": "one_per_thread", "waves": 1, "unroll": 4, "block": 128},
            {**base, "vec": 1, "block": 1024, "waves": 2},
        ]
