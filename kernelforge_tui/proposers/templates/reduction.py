"""Full reductions to one value: out[0] = sum (or mean) over i of term(in0[i][, in1[i]]), math in fp32, one launch.

The operation is read from the card's reference function or name (dot_product: sum of a * b; mse_loss: mean of
(a - b)^2; hinge_loss: mean of max(0, 1 - a * b)); inputs are the card's inputs in order, all of one shape, the
output one element, one dtype throughout.

Why no atomics and no grid-wide counter: the output is poisoned before every launch (accumulating into it is
wrong), a card gives no zeroed scratch memory, and a module-scope counter reset by the last block breaks as soon
as the same kernel runs twice at once (two streams, a packaged model's threads). So the blocks that share the
work are one thread block cluster (Hopper, sm_90): each block reduces its share, then block 0 adds the others'
sums through distributed shared memory. Stateless, deterministic (fixed order), one launch.

Parameters: `blocks` (1: a single block; 2, 4, 8: one cluster of that many blocks, each on its own SM; 8 is
the portable cluster limit), `block` (threads), `vec` (elements per 16-byte-or-less load; n % vec leftovers go
through a scalar tail), `unroll` (vector chunks per thread per step, each with its own accumulator, all loads
issued before the math).
"""

from __future__ import annotations

from typing import NamedTuple

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    Params,
    Space,
    Template,
    dtype_of,
    launch_bounds,
    prelude,
    reduce_helpers,
    vec_widths,
)
from kernelforge_tui.proposers.templates.elementwise import operation_in


class Reduction(NamedTuple):
    """One reduction: how many inputs, the fp32 term of one element (a C function body over a0, a1), and whether
    the sum is divided by the element count."""

    arity: int
    term: str
    mean: bool


OPS: dict[str, Reduction] = {
    "dot_product": Reduction(2, "return a0 * a1;", mean=False),
    "mse_loss": Reduction(2, "const float d = a0 - a1;\n return d * d;", mean=True),
    # max(0, d) that keeps NaN, as torch.clamp_min does (fmaxf would drop it)
    "hinge_loss": Reduction(2, "const float d = 1.0f - a0 * a1;\n return d < 0.0f ? 0.0f : d;", mean=True),
}


LOADED_FLOATS_PER_BLOCK = 32 * 1024
"""Loaded values a block may hold in flight: half of the 64K registers, so a 1024-thread block keeps 32 a thread
(more spilled: ptxas put 116 bytes on the stack for 64 at 1024 threads)."""


def operation(card: OperatorCard) -> str | None:
    """The OPS name in the reference function, else in the card name."""
    return operation_in((card.reference.function or "", card.name), OPS)


class ReductionTemplate(Template):
    families = ("reduction",)
    entry = "kf_reduction"

    def unsupported(self, card: OperatorCard) -> str | None:
        op = operation(card)
        if op is None:
            return f"no known full reduction in {card.name!r} (known: {', '.join(OPS)})"
        arity = OPS[op].arity
        if len(card.inputs) != arity or len(card.outputs) != 1:
            return f"{op} takes {arity} inputs and one output"
        tensors = [*card.inputs, card.outputs[0]]
        if len({t.dtype for t in tensors}) != 1 or tensors[0].dtype not in C_TYPE:
            return f"expects one dtype among {sorted(C_TYPE)}"
        shape = card.inputs[0].dims(card.sizes)
        if any(t.dims(card.sizes) != shape for t in card.inputs):
            return "inputs must have one shape"
        if card.outputs[0].numel(card.sizes) != 1:
            return "the output must be one element (a full reduction)"
        return None

    def space(self, card: OperatorCard) -> Space:
        return {
            "blocks": (1, 2, 4, 8),
            "block": (256, 512, 1024),
            "vec": vec_widths(dtype_of(card)),
            "unroll": (1, 2, 4),
        }

    def problem(self, card: OperatorCard, params: Params) -> str | None:
        """Every combination is correct for any n; only register pressure rules some out."""
        op = operation(card)
        assert op is not None
        held = OPS[op].arity * int(params["unroll"]) * int(params["vec"])
        if held * int(params["block"]) > LOADED_FLOATS_PER_BLOCK:
            return f"{held} loaded floats per thread x {params['block']} threads would spill registers"
        return None

    def _count(self, card: OperatorCard) -> str:
        return " * ".join(f"({dim})" for dim in card.inputs[0].shape)

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        op = operation(card)
        assert op is not None
        arity, term, mean = OPS[op]
        dtype = dtype_of(card)
        blocks, block, vec, unroll = (int(params[k]) for k in ("blocks", "block", "vec", "unroll"))
        names = [t.name for t in card.inputs]
        out = card.outputs[0].name
        signature = ", ".join([*(f"const T* __restrict__ {n}" for n in names), f"T* __restrict__ {out}", "long long n"])
        decl = "".join(f" float in{k}[UNROLL][VEC];\n" for k in range(arity))
        loads = "".join(f"   load_chunk({n}, i, in{k}[u]);\n" for k, n in enumerate(names))
        args = ", ".join(f"in{k}[u][j]" for k in range(arity))
        scalar_args = ", ".join(f"to_f({n}[i])" for n in names)
        params_c = ", ".join(f"float a{k}" for k in range(arity))

        def result(total: str) -> str:
            return f"{total} / (float)n" if mean else total

        if blocks == 1:
            cluster_attr, include = "", ""
            finish = f"""if (threadIdx.x == 0) {{
 {out}[0] = from_f({result("total")});
}}"""
        else:
            cluster_attr = f"__attribute__((cluster_dims({blocks}, 1, 1))) "
            include = "#include <cooperative_groups.h>\n"
            finish = f"""// Block 0 adds the cluster's block sums in rank order (distributed shared memory);
// the second sync keeps every block's shared memory alive until block 0 has read it.
__shared__ float block_total;
if (threadIdx.x == 0) {{
 block_total = total;
}}
cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
cluster.sync();
if (cluster.block_rank() == 0 && threadIdx.x == 0) {{
 float cluster_total = 0.0f;
 for (int r = 0; r < BLOCKS; ++r) {{
  cluster_total += *cluster.map_shared_rank(&block_total, r);
 }}
 {out}[0] = from_f({result("cluster_total")});
}}
cluster.sync();"""
        strategy = "one block" if blocks == 1 else f"one cluster of {blocks} blocks"
        source = f"""// {op} ({dtype}): {strategy} of {block} threads, {vec}-element loads, {unroll} per step.
// Generated by the template proposer.
{include}{prelude(dtype, vec)}{reduce_helpers(False)}#define BLOCK {block}
#define BLOCKS {blocks}
#define UNROLL {unroll}

__device__ __forceinline__ float term({params_c}) {{
 {term}
}}

extern "C" __global__ {cluster_attr}void {launch_bounds(block, 1)} {self.entry}({signature}) {{
const long long nvec = n / VEC;
const long long step = (long long)BLOCKS * BLOCK * UNROLL;
float acc[UNROLL];
#pragma unroll
for (int u = 0; u < UNROLL; ++u) {{
 acc[u] = 0.0f;
}}
for (long long base = (long long)blockIdx.x * (BLOCK * UNROLL) + threadIdx.x; base < nvec; base += step) {{
{decl}#pragma unroll
 for (int u = 0; u < UNROLL; ++u) {{
  const long long i = base + (long long)u * BLOCK;
  if (i < nvec) {{
{loads}  }}
 }}
#pragma unroll
 for (int u = 0; u < UNROLL; ++u) {{
  if (base + (long long)u * BLOCK < nvec) {{
#pragma unroll
   for (int j = 0; j < VEC; ++j) {{
    acc[u] += term({args});
   }}
  }}
 }}
}}
float mine = 0.0f;
#pragma unroll
for (int u = 0; u < UNROLL; ++u) {{
 mine += acc[u];
}}
// The n % VEC leftover elements, one per thread of block 0.
const long long i = nvec * VEC + threadIdx.x;
if (blockIdx.x == 0 && i < n) {{
 mine += term({scalar_args});
}}
__shared__ Sum red[32];
const float total = group_reduce<BLOCK>(Sum{{mine}}, red).s;
{finish}
}}
"""
        count = f"{self._count(card)}:i64"
        plan = LaunchPlan(entry=self.entry, grid=[blocks], block=[block], args=[*names, out, count])
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
