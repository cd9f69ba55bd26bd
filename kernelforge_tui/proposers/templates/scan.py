"""Inclusive scans (prefix sums) in one launch: y[i] = x[0] + ... + x[i], fp32 sums.

Convention: x [n] -> y [n], size n, one dtype (fp32/bf16/fp16).

Why every block re-sums what comes before it: the fast single-pass scans (CUB's decoupled look-back, a chained
scan) hand each block's total to the next through flags in memory that must be zeroed (or stamped with an epoch)
before the launch, and a card gives its kernel one launch and its tensors only: outputs are poisoned, not zeroed,
there is no scratch buffer and no grid-wide barrier, so no block may wait for another. What a block can do alone
is read: block b sums x[0, b * CHUNK) itself (its carry), then scans its own chunk. That is correct for every n and
launch order, and costs n^2 / (2 * CHUNK) reads in all: at n = 2^22 and CHUNK = 8192, 1.1e9 (4 GB in fp32, mostly
from L2), against 2n for a look-back scan. So the parameters trade the carry's cost (a bigger chunk: fewer
re-reads, and vector loads for them) against parallelism (fewer, busier blocks; the last block's carry is read by
one SM). This is as far as an honest single-launch scan goes; beating CUB at large n needs scratch memory or a
second launch, which cards do not offer.

Parameters: `block` (threads), `ipt` (consecutive items per thread: CHUNK = block * ipt), `vec` (elements per
vector load of the carry; chunks start at multiples of CHUNK, so every load is aligned and there is no tail), and
`stage` (1: the chunk goes through shared memory, loaded and stored coalesced; 0: each thread reads and writes its
ipt consecutive elements straight from global memory). The kernel is cuda/scan.cu.
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    STATIC_SHARED,
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

SMALLEST_CHUNK = 128
MOST_REREADS = 4096
"""A chunk must be at least n / 4096: smaller ones re-read x more than n / 2 / CHUNK = 2048 times over (the suite's
naive baseline, CHUNK 2048, re-reads it 1024 times at 2^22), slower than the baseline before they start."""


def _staged_bytes(chunk: int) -> int:
    """The staged chunk as fp32, one padding slot per 32 (so a thread's consecutive items fall in different banks),
    plus the warp totals and the reduction's scratch."""
    return 4 * (chunk + chunk // 32) + 2 * 4 * 32


class ScanParams(TemplateParams):
    block: int
    ipt: int
    vec: int
    stage: int


class ScanTemplate(Template[ScanParams]):
    name = "scan"
    families = ("scan",)
    entry = "kf_scan"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("ipt", "up", "bigger chunks: fewer re-reads for the carries"),
            Lever("vec", "up", "wider carry loads"),
            Lever("stage", "up", "coalesced chunk loads and stores"),
        ),
        "memory_latency": (
            Lever("block", "up", "more threads sum each carry"),
            Lever("vec", "up", "more bytes per carry load"),
        ),
        "compute": (
            Lever("vec", "up", "fewer instructions per carry element"),
            Lever("ipt", "up", "fewer carry re-reads"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        problem = naming_problem(card, ["x"], ["y"], ["n"])
        if problem is None and any(t.numel(card.sizes) != card.sizes["n"] for t in [*card.inputs, *card.outputs]):
            return "x and y must have n elements (a scan over one axis)"
        return problem

    def space(self, card: OperatorCard) -> Space:
        return {
            "block": (128, 256, 512, 1024),
            "ipt": (1, 2, 4, 8, 16),
            "vec": vec_widths(dtype_of(card)),
            "stage": (0, 1),
        }

    def params_type(self, card: OperatorCard) -> type[ScanParams]:
        return ScanParams

    def canonical(self, card: OperatorCard, params: ScanParams) -> ScanParams:
        # One item per thread is coalesced either way: staging changes nothing.
        return params.but(stage=0) if params.ipt == 1 else params

    def problem(self, card: OperatorCard, params: ScanParams) -> str | None:
        chunk = params.block * params.ipt
        n = card.sizes["n"]
        if chunk > max(n, SMALLEST_CHUNK):
            return f"a chunk of {chunk} exceeds n = {n}: most threads would idle"
        if n > MOST_REREADS * chunk:
            return f"a chunk of {chunk} re-reads x {n // (2 * chunk)} times over (n / {MOST_REREADS} at least)"
        if params.stage and _staged_bytes(chunk) > STATIC_SHARED:
            return f"staging a chunk of {chunk} needs {_staged_bytes(chunk)} bytes of shared memory (48 KiB at most)"
        return None

    def render(self, card: OperatorCard, params: ScanParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        block, ipt, vec, stage = params.block, params.ipt, params.vec, params.stage
        source = render(
            "scan.cu",
            **prelude_values(dtype, vec),
            **reduce_values(False),
            dtype=dtype,
            block=block,
            ipt=ipt,
            stage=stage,
        )
        plan = LaunchPlan(entry=self.entry, grid=[f"cdiv(n, {block * ipt})"], block=[block], args=["x", "y", "n:i64"])
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        widest = max(vec_widths(dtype_of(card)))
        return [
            {"block": 256, "ipt": 8, "vec": widest, "stage": 1},
            {"block": 1024, "ipt": 8, "vec": widest, "stage": 1},
            {"block": 512, "ipt": 16, "vec": widest, "stage": 0},
            {"block": 128, "ipt": 4, "vec": 1, "stage": 0},
        ]
