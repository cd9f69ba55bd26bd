"""Matrix-vector products y = A x, products and sums in fp32.

Convention: inputs A [M, K] and x [K], output y [M], row-major, one dtype (fp32, bf16 or fp16); M and K are read
from the shapes and passed as the shapes' own formulas.

Why not the matmul template: with one column there is nothing to tile. Every element of A is used once, so the
kernel is a stream of A (x, K elements, stays in L1 and L2) and the work is reading rows fast: TPR consecutive
threads share a row (a warp, part of one, or several warps), each loading every TPR-th 16-byte-or-less chunk of the
row and of x with UNROLL loads in flight and their own accumulators, then a shuffle reduction (through shared memory
past a warp) gives the row's sum. The kernel is cuda/gemv.cu.

Parameters: `tpr` (threads per row), `block`, `vec` (elements per load: must divide K, so every chunk of a row is
aligned and there is no tail), `unroll`.
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    naming_problem,
    prelude_values,
    reduce_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import render

MAX_LOADED = 32
"""Loaded floats a thread may hold (A's and x's chunks): 2 x unroll x vec, as the reduction template's budget."""


class GemvParams(TemplateParams):
    tpr: int
    block: int
    vec: int
    unroll: int


class GemvTemplate(Template[GemvParams]):
    name = "gemv"
    families = ("matmul",)
    entry = "kf_gemv"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (Lever("vec", "up", "wider accesses"),),
        "memory_latency": (
            Lever("unroll", "up", "more loads in flight"),
            Lever("tpr", "any", "threads per row"),
            Lever("block", "any", "block size"),
        ),
        "compute": (
            Lever("vec", "up", "fewer instructions per element"),
            Lever("unroll", "up", "independent accumulators"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        problem = naming_problem(card, ["A", "x"], ["y"], [])
        if problem is not None:
            return problem
        a, x, y = (t.dims(card.sizes) for t in [*card.inputs, *card.outputs])
        if len(a) != 2 or x != a[1:] or y != a[:1]:
            return f"expects A [M, K], x [K] -> y [M], card has {list(a)} x {list(x)} -> {list(y)}"
        return None

    def space(self, card: OperatorCard) -> Space:
        return {
            "tpr": (4, 8, 16, 32, 64, 128, 256),
            "block": (64, 128, 256, 512, 1024),
            "vec": vec_widths(dtype_of(card)),
            "unroll": (1, 2, 4),
        }

    def params_type(self, card: OperatorCard) -> type[GemvParams]:
        return GemvParams

    def problem(self, card: OperatorCard, params: GemvParams) -> str | None:
        tpr, block, vec, unroll = params.tpr, params.block, params.vec, params.unroll
        k = card.inputs[0].dims(card.sizes)[1]
        if k % vec:
            return f"vec {vec} does not divide K = {k}"
        if tpr > block:
            return f"{tpr} threads per row exceed the block of {block}"
        if tpr > k // vec:
            return f"{tpr} threads per row exceed its {k // vec} chunks"
        if 2 * unroll * vec > MAX_LOADED:
            return f"{2 * unroll * vec} loaded floats per thread (at most {MAX_LOADED})"
        return None

    def render(self, card: OperatorCard, params: GemvParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        tpr, block, vec, unroll = params.tpr, params.block, params.vec, params.unroll
        source = render(
            "gemv.cu",
            **prelude_values(dtype, vec),
            **reduce_values(False),
            dtype=dtype,
            tpr=tpr,
            block=block,
            unroll=unroll,
        )
        m, k = (str(dim) for dim in card.inputs[0].shape)
        plan = LaunchPlan(
            entry=self.entry, grid=[f"cdiv({m}, {block // tpr})"], block=[block], args=["A", "x", "y", m, k]
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        vec = max(vec_widths(dtype_of(card)))
        return [
            {"tpr": 32, "block": 256, "vec": vec, "unroll": 2},
            {"tpr": 8, "block": 128, "vec": vec, "unroll": 1},
            {"tpr": 128, "block": 256, "vec": vec, "unroll": 2},
            {"tpr": 16, "block": 512, "vec": 1, "unroll": 4},
        ]
