"""The bench's numbers: each card's speedup, rates and share of its roofline, the vendor beside ours, the suite score.

Why a weighted mean: the issue asks that "the suite score is the mean weighted by each task's theoretical operation
count at that scale, so large-scale wins count most". A 3x on a 2^10-element vector add is a few microseconds nobody
waits for; a 3x on a 2^22-element one is what a user feels. So every (task, precision, scale) card weighs its FLOP
count (the card's `cost.flops`, which the suite's tests keep above zero), and the score is
sum(flops x speedup) / sum(flops); the score per scale is the same over that scale's cards alone.

Which cards count: a searched card counts its best speedup over its baseline (the search's promoted best: the
baseline itself, 1.0x, when nothing beat it). A card no template serves counts 1.0x with the template proposer: the
bench found nothing for it, and leaving it out would score the suite on the tasks it is good at. A card whose
search failed (its baseline did not build or pass) or did not run has no speedup and does not count; the report
lists it.

The roofline: the least time the operator can take on the GPU is max(bytes / copy ceiling, FLOPs / peak FLOP rate),
the ceilings being the ones the GPU worker measures (`vocabulary.evaluation.Ceilings`, cached per GPU); a card's share
is that time over its best time. It is the worker's own `ceiling_share` (achieved rate over the ceiling of the bound
side, as `gpu.ncu.hardware.roofline` places a kernel), taken for the best kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from kernelforge_tui.suite.task import Precision
from kernelforge_tui.vocabulary.evaluation import Ceilings

Status = Literal["searched", "no-template", "failed", "not-run"]
COUNTED_AS_BASELINE: tuple[Status, ...] = ("no-template",)
"""Statuses whose card counts 1.0x in the score: nothing was searched, so the baseline stands."""


def peak_tflops(ceilings: Ceilings, precision: Precision) -> float:
    """The peak FLOP rate a card of this precision is held against: the one the worker's ceiling check holds its
    candidates to (`Ceilings.compute_tflops`: the tensor-core rate for bf16, the FP32 FMA rate for fp32)."""
    return ceilings.compute_tflops([precision])


def roofline_us(flops: int, moved_bytes: int, ceilings: Ceilings, precision: Precision) -> float:
    """The least time in microseconds the operator can take: its bytes at the copy ceiling or its FLOPs at the peak
    rate, whichever is longer."""
    memory_us = moved_bytes / (ceilings.copy_gbps * 1e3)
    compute_us = flops / (peak_tflops(ceilings, precision) * 1e6)
    return max(memory_us, compute_us)


class CardResult(BaseModel):
    """What the bench measured for one (task, precision, scale) card: the input to the score."""

    model_config = ConfigDict(frozen=True)

    task: str
    family: str
    precision: Precision
    scale: int
    """Elements of the task's main tensor."""
    flops: int
    bytes: int
    status: Status
    baseline_us: float | None = None
    """The baseline's median, measured beside the best kernel."""
    best_us: float | None = None
    """The best kernel's median (the baseline's own when nothing beat it)."""
    roofline_us: float | None = None
    """The least time the operator can take (`roofline_us`); None where no ceilings are known."""
    vendor: str | None = None
    """The vendor library that has the operation, when one does."""
    vendor_us: float | None = None
    vendor_agrees: bool | None = None
    """Whether the vendor's outputs matched the card's reference at the card's tolerance."""
    note: str = ""
    """Why a card has no numbers (no template, a failed baseline), or what else to know about them."""


class Scored(CardResult):
    """A card's result with what follows from it."""

    speedup: float | None
    """Baseline over best; 1.0 for a card counted as its baseline; None for one that does not count."""
    achieved_gbps: float | None
    achieved_gflops: float | None
    roofline_share: float | None
    """The roofline time over the best time (1.0: at the ceiling)."""
    vendor_ratio: float | None
    """Ours over the vendor's time: below 1 where our best kernel is faster than the vendor's."""

    @property
    def log2_scale(self) -> int:
        return self.scale.bit_length() - 1


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


def score_card(result: CardResult) -> Scored:
    """One card's speedup, achieved rates, share of its roofline and ratio to the vendor."""
    measured = result.status == "searched" and result.best_us is not None
    if measured:
        speedup = _ratio(result.baseline_us, result.best_us)
    else:
        speedup = 1.0 if result.status in COUNTED_AS_BASELINE else None
    seconds = result.best_us * 1e-6 if measured and result.best_us else None
    return Scored(
        **result.model_dump(),
        speedup=speedup,
        achieved_gbps=result.bytes / seconds / 1e9 if seconds else None,
        achieved_gflops=result.flops / seconds / 1e9 if seconds else None,
        roofline_share=_ratio(result.roofline_us, result.best_us) if measured else None,
        vendor_ratio=_ratio(result.best_us, result.vendor_us) if measured else None,
    )


def score_cards(results: Iterable[CardResult]) -> list[Scored]:
    return [score_card(r) for r in results]


def suite_score(rows: Iterable[Scored]) -> float | None:
    """The suite score: the FLOP-weighted mean speedup of the cards that count; None when none does."""
    counted = [(row.flops, row.speedup) for row in rows if row.speedup is not None and row.flops > 0]
    total = sum(flops for flops, _ in counted)
    if not total:
        return None
    return sum(flops * speedup for flops, speedup in counted) / total


def scale_scores(rows: Sequence[Scored]) -> dict[int, float]:
    """The score at each scale (elements of the main tensor), over that scale's counted cards, smallest first."""
    scores: dict[int, float] = {}
    for scale in sorted({row.scale for row in rows}):
        score = suite_score(row for row in rows if row.scale == scale)
        if score is not None:
            scores[scale] = score
    return scores


def beats_vendor(rows: Iterable[Scored]) -> list[Scored]:
    """The cards whose best kernel is faster than the vendor's, by how much (largest win first)."""
    wins = [row for row in rows if row.vendor_ratio is not None and row.vendor_ratio < 1.0]
    return sorted(wins, key=lambda row: row.vendor_ratio or 0.0)
