"""Matrix powers C = A^power in one launch, intermediates in fp32 (the suite's matrix_power).

Convention: A [n, n] -> C [n, n], sizes n and power (the card says its power), one dtype. Why rows chained and not
squarings: A^4 by squaring needs A^2 whole before (A^2)^2 starts, a grid-wide barrier no single launch has, and
somewhere to keep A^2 in fp32 (the task's contract keeps intermediates unrounded, and C is bf16 on bf16 cards).
Row i of A^p is row i of A^(p-1) times A, so a block owns `bm` rows and multiplies them by A power - 1 times,
keeping them in dynamic shared memory as fp32 (two copies: the rows read and the rows written, 8 bm n bytes); the
cost is power - 1 products instead of log2(power), and the grid is n / bm blocks. Each product steps over A's
columns `bn` at a time, through K `bk` at a time with A's tile staged in shared memory (`vec`-element loads), each
thread summing a `tm` x `tn` strided micro-tile in registers. bm, bn and bk must divide n.

The kernel is cuda/matrix_power.cu.
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    MAX_DYNAMIC_SHARED,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    naming_problem,
    prelude_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import render

MAX_ACCUMULATORS = 64
"""tm x tn fp32 sums a thread holds, as the matmul template's micro-tile."""
SEED_ROWS = 16
"""The most rows a seed's block chains: more leaves too few blocks on the suite's small cards."""


class MatrixPowerParams(TemplateParams):
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    vec: int


def _threads(params: MatrixPowerParams) -> int:
    return params.bm // params.tm * (params.bn // params.tn)


def _shared(n: int, params: MatrixPowerParams) -> tuple[int, int]:
    """(dynamic bytes: the two fp32 copies of the block's rows, static bytes: A's tile)."""
    return 2 * params.bm * n * 4, params.bk * params.bn * 4


class MatrixPowerTemplate(Template[MatrixPowerParams]):
    name = "matrix_power"
    families = ("matmul",)
    entry = "kf_matrix_power"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("bm", "up", "A read once for more rows"),
            Lever("vec", "up", "wider tile loads"),
        ),
        "memory_latency": (
            Lever("bm", "down", "more blocks"),
            Lever("bk", "up", "more of K staged per barrier"),
        ),
        "compute": (
            Lever("tm", "up", "more FMAs per shared load"),
            Lever("tn", "up", "more FMAs per shared load"),
            Lever("bn", "any", "threads per block"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        problem = naming_problem(card, ["A"], ["C"], ["n", "power"])
        if problem is not None:
            return problem
        shapes = [tuple(map(str, t.shape)) for t in [*card.inputs, *card.outputs]]
        if shapes != [("n", "n"), ("n", "n")]:
            return f"expects A [n, n] -> C [n, n] = A^power, card has {shapes}"
        if card.sizes["power"] < 2:
            return f"power {card.sizes['power']}: a matrix power here multiplies at least once (power >= 2)"
        return None

    def space(self, card: OperatorCard) -> Space:
        return {
            "bm": (1, 2, 4, 8, 16, 32),
            "bn": (32, 64, 128, 256),
            "bk": (8, 16, 32),
            "tm": (1, 2, 4, 8),
            "tn": (1, 2, 4, 8),
            "vec": vec_widths(dtype_of(card)),
        }

    def params_type(self, card: OperatorCard) -> type[MatrixPowerParams]:
        return MatrixPowerParams

    def problem(self, card: OperatorCard, params: MatrixPowerParams) -> str | None:
        n, p = card.sizes["n"], params
        for name, part, whole in (("bm", p.bm, n), ("bn", p.bn, n), ("bk", p.bk, n), ("tm", p.tm, p.bm),
                                  ("tn", p.tn, p.bn), ("vec", p.vec, p.bn)):  # fmt: skip
            if whole % part:
                return f"{name} {part} does not divide {whole}"
        threads = _threads(p)
        if not 32 <= threads <= 1024:
            return f"{p.bm // p.tm} x {p.bn // p.tn} = {threads} threads per block, outside 32..1024"
        if p.tm * p.tn > MAX_ACCUMULATORS:
            return f"{p.tm * p.tn} accumulators per thread (at most {MAX_ACCUMULATORS})"
        if sum(shared := _shared(n, p)) > MAX_DYNAMIC_SHARED:
            return f"{shared[0]} bytes of chained rows and {shared[1]} of A's tile exceed {MAX_DYNAMIC_SHARED}"
        return None

    def render(self, card: OperatorCard, params: MatrixPowerParams) -> tuple[str, LaunchPlan]:
        dtype, p, n = dtype_of(card), params, card.sizes["n"]
        source = render(
            "matrix_power.cu",
            **prelude_values(dtype, p.vec),
            dtype=dtype,
            n=n,
            power=card.sizes["power"],
            bm=p.bm,
            bn=p.bn,
            bk=p.bk,
            tm=p.tm,
            tn=p.tn,
            threads=_threads(p),
        )
        plan = LaunchPlan(
            entry=self.entry,
            grid=[f"n / {p.bm}"],
            block=[_threads(p)],
            shared_bytes=_shared(n, p)[0],
            args=["A", "C"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """The most rows a block whose two copies fit beside a tile (up to SEED_ROWS), 4 x 4 micro-tiles first;
        then half the rows (twice the blocks), 2 x 2 micro-tiles over a narrower pass, and rows one at a time (the
        baseline's shape, tiled)."""
        n = card.sizes["n"]
        rows = max(r for r in (1, 2, 4, 8, 16) if r == 1 or 8 * r * n + 32 * 256 * 4 <= MAX_DYNAMIC_SHARED)
        rows = min(rows, SEED_ROWS, n)
        vec = max(vec_widths(dtype_of(card)))
        base: Params = {"bm": rows, "bn": 256, "bk": 16, "tm": min(4, rows), "tn": 4, "vec": vec}
        return [
            base,
            {**base, "bm": max(1, rows // 2), "tm": min(2, max(1, rows // 2))},
            {**base, "bn": 128, "tm": min(2, rows), "tn": 2},
            {**base, "bm": 1, "tm": 1, "tn": 1, "vec": 1},
        ]
