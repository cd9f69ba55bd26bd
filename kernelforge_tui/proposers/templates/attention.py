"""Attention forward, flash-style on CUDA cores: o = softmax(q k^T / sqrt(d) (+ bias)) v, never the score matrix.

Conventions (the suite's): softmax_attention, q, k, v, o [heads, seq, d] (sizes heads, seq, d; a group is a head),
and triangle_attention, q, k, v, o [n, n, heads, c] with bias [n, n, heads] (sizes n, heads, c; a group is a pair
(i, h), its rows (i, j, h) lie heads * c apart, and bias[j, k, h] joins query j's score of key k). Captured
attention cards (batch, masks, other layouts) are not served: their shapes say why.

A block takes `bq` query rows of one group, `tpr` threads a row (each holding d / tpr of its dims in registers; the
score's partial dot products meet by warp shuffles), and walks the group's keys `bkv` at a time: K's and V's tiles
staged in shared memory as fp32 (`vec`-element loads), the row's running max, sum and weighted values rescaled by
exp(old max - new max) once a tile (online softmax). `fast_exp` takes __expf where every output's tolerance admits
it (common.fast_math_allowed). bq and bkv must divide the group's rows.

The kernel is cuda/attention_flash.cu.
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    STATIC_SHARED,
    THREADS_PER_SM,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    fast_math_allowed,
    naming_problem,
    prelude_values,
    reduce_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import render

HEADS = ("heads", "seq", "d")
PAIRS = ("n", "n", "heads", "c")
MAX_SCORES = 64
"""Scores of a tile a thread holds in registers."""


class AttentionParams(TemplateParams):
    bq: int
    tpr: int
    bkv: int
    vec: int
    fast_exp: int


def _triangle(card: OperatorCard) -> bool:
    return len(card.inputs) == 4


def _geometry(card: OperatorCard) -> dict[str, int]:
    """d (a row's length), rows (a group's queries and keys), h (groups interleaved in memory), groups."""
    s = card.sizes
    if _triangle(card):
        return {"d": s["c"], "rows": s["n"], "h": s["heads"], "groups": s["n"] * s["heads"]}
    return {"d": s["d"], "rows": s["seq"], "h": 1, "groups": s["heads"]}


class AttentionTemplate(Template[AttentionParams]):
    name = "attention"
    families = ("attention",)
    entry = "kf_attention"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (Lever("vec", "up", "wider tile loads"), Lever("bq", "up", "each tile serves more rows")),
        "memory_latency": (Lever("tpr", "up", "more threads a row"), Lever("bq", "down", "more blocks")),
        "compute": (
            Lever("fast_exp", "up", "fast exp"),
            Lever("bkv", "up", "fewer rescales and barriers"),
            Lever("tpr", "down", "fewer shuffles a score"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        triangle = _triangle(card)
        inputs = ["q", "k", "v", "bias"] if triangle else ["q", "k", "v"]
        problem = naming_problem(card, inputs, ["o"], ["n", "heads", "c"] if triangle else list(HEADS))
        if problem is not None:
            return problem
        rows = PAIRS if triangle else HEADS
        want = [rows] * 3 + ([PAIRS[:3]] if triangle else []) + [rows]
        have = [tuple(map(str, t.shape)) for t in [*card.inputs, *card.outputs]]
        if have != want:
            return f"expects {' , '.join(map(str, want))} (the suite's attention layouts), card has {have}"
        return None

    def space(self, card: OperatorCard) -> Space:
        return {
            "bq": (4, 8, 16, 32, 64, 128),
            "tpr": (1, 2, 4, 8, 16, 32),
            "bkv": (4, 8, 16, 32, 64),
            "vec": vec_widths(dtype_of(card)),
            "fast_exp": (0, 1) if fast_math_allowed(card) else (0,),
        }

    def params_type(self, card: OperatorCard) -> type[AttentionParams]:
        return AttentionParams

    def problem(self, card: OperatorCard, params: AttentionParams) -> str | None:
        g, p = _geometry(card), params
        for name, part, whole in (("bq", p.bq, g["rows"]), ("bkv", p.bkv, g["rows"]), ("tpr", p.tpr, g["d"]),
                                  ("vec", p.vec, g["d"])):  # fmt: skip
            if whole % part:
                return f"{name} {part} does not divide {whole}"
        threads = p.bq * p.tpr
        if threads % 32 or not 32 <= threads <= 1024:
            return f"{p.bq} x {p.tpr} = {threads} threads per block: whole warps, 32..1024"
        if p.bkv > MAX_SCORES or 2 * g["d"] // p.tpr > 128:
            return f"{p.bkv} scores and {2 * g['d'] // p.tpr} row values a thread: too many registers"
        if (shared := 2 * p.bkv * g["d"] * 4) > STATIC_SHARED:
            return f"{shared} bytes of K and V tiles exceed {STATIC_SHARED}"
        if threads > THREADS_PER_SM:
            return f"{threads} threads exceed an SM's"
        return None

    def render(self, card: OperatorCard, params: AttentionParams) -> tuple[str, LaunchPlan]:
        g, p, triangle = _geometry(card), params, _triangle(card)
        threads = p.bq * p.tpr
        source = render(
            "attention_flash.cu",
            **prelude_values(dtype_of(card), p.vec),
            **reduce_values(bool(p.fast_exp)),
            dtype=dtype_of(card),
            bias=triangle,
            bias_words=" + bias" if triangle else "",
            d=g["d"],
            rows=g["rows"],
            h=g["h"],
            bq=p.bq,
            tpr=p.tpr,
            bkv=p.bkv,
            threads=threads,
        )
        tensors = ["q", "k", "v", *(["bias"] * triangle), "o"]
        grid = g["groups"] * (g["rows"] // p.bq)
        return source, LaunchPlan(entry=self.entry, grid=[grid], block=[threads], args=tensors)

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """Four threads a row over tiles of 32 keys first (16 of a row's 64 dims a thread, two shuffles a score),
        fast exp where allowed; then wider and narrower rows, and the thread-a-row kernel (the baseline's split,
        single pass)."""
        fast = int(fast_math_allowed(card))
        base: Params = {"bq": 64, "tpr": 4, "bkv": 32, "vec": max(vec_widths(dtype_of(card))), "fast_exp": fast}
        return [
            base,
            {**base, "bq": 32, "tpr": 8},
            {**base, "bq": 128, "tpr": 2, "bkv": 16},
            {**base, "fast_exp": 0},
            {**base, "bq": 128, "tpr": 1, "bkv": 16},
        ]
