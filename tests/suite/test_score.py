"""The bench's score on hand-computed examples: speedups, rates, roofline shares, the vendor ratio, and the suite
score as a FLOP-weighted mean (overall and per scale), with which cards count and which do not."""

from __future__ import annotations

import pytest

from kernelforge_tui.gpu.ncu.hardware import roofline
from kernelforge_tui.suite.score import (
    CardResult,
    beats_vendor,
    roofline_us,
    scale_scores,
    score_card,
    score_cards,
    suite_score,
)
from kernelforge_tui.vocabulary.evaluation import Ceilings

CEILINGS = Ceilings(
    gpu_name="test GPU", copy_gbps=1000.0, fma_tflops=10.0, capability=(9, 0), sm_count=132, l2_bytes=50 << 20
)
SMALL, LARGE = 2**10, 2**14


def card(task: str, flops: int, moved: int, status: str = "searched", scale: int = SMALL, **more: object) -> CardResult:
    return CardResult.model_validate(
        {
            "task": task,
            "family": "other",
            "precision": "float32",
            "scale": scale,
            "flops": flops,
            "bytes": moved,
            "status": status,
            **more,
        }
    )


# A: memory-bound. 20 MB at 1000 GB/s = 20 us; 1 MFLOP at 10 TFLOP/s = 0.1 us. Baseline 100 us, best 50 us.
A = card("a", 1_000_000, 20_000_000, baseline_us=100.0, best_us=50.0, roofline_us=20.0, vendor="lib", vendor_us=40.0)
# B: compute-bound. 3 MFLOP at 10 TFLOP/s = 0.3 us; 1 kB = 0.001 us. Baseline 1.8 us, best 0.6 us; vendor 1.2 us.
B = card("b", 3_000_000, 1_000, baseline_us=1.8, best_us=0.6, roofline_us=0.3, vendor="lib", vendor_us=1.2)
# C: no template at the large scale, counted as its baseline (1.0x); D: failed, not counted however many FLOPs.
C = card("c", 6_000_000, 1_000, status="no-template", scale=LARGE)
D = card("d", 10**12, 1_000, status="failed", scale=LARGE)


def test_roofline_time_is_the_longer_of_memory_and_compute_at_the_ceilings() -> None:
    assert roofline_us(A.flops, A.bytes, CEILINGS, "float32") == pytest.approx(20.0)
    assert roofline_us(B.flops, B.bytes, CEILINGS, "float32") == pytest.approx(0.3)
    assert roofline_us(B.flops, B.bytes, CEILINGS, "bfloat16") == pytest.approx(0.3 / 16)  # bf16: tensor cores


def test_a_card_scored_by_hand() -> None:
    a = score_card(A)
    assert a.speedup == pytest.approx(2.0)
    assert a.achieved_gbps == pytest.approx(400.0)  # 20 MB in 50 us
    assert a.achieved_gflops == pytest.approx(20.0)  # 1 MFLOP in 50 us
    assert a.roofline_share == pytest.approx(0.4)  # 20 us of 50
    assert a.vendor_ratio == pytest.approx(1.25)  # ours 50 us, the vendor's 40: slower
    b = score_card(B)
    assert (b.speedup, b.roofline_share, b.vendor_ratio) == pytest.approx((3.0, 0.5, 0.5))
    c, d = score_card(C), score_card(D)
    assert c.speedup == 1.0 and c.roofline_share is None and c.achieved_gbps is None
    assert d.speedup is None and d.vendor_ratio is None


def test_the_share_is_the_roofline_position_the_profiler_reports() -> None:
    """Both views of one kernel agree: score's share equals gpu.ncu.hardware.roofline's share of the attainable."""
    for result in (A, B):
        assert result.best_us is not None
        seconds = result.best_us * 1e-6
        placed = roofline(result.flops, result.bytes, seconds, CEILINGS, "measured")
        share = roofline_us(result.flops, result.bytes, CEILINGS, "float32") / result.best_us
        assert share == pytest.approx(placed.share_of_attainable)


def test_suite_score_is_the_flop_weighted_mean_computed_by_hand() -> None:
    rows = score_cards([A, B, C, D])
    # (1e6 x 2.0 + 3e6 x 3.0 + 6e6 x 1.0) / (1e6 + 3e6 + 6e6) = 17e6 / 10e6; D (failed) carries no weight.
    assert suite_score(rows) == pytest.approx(1.7)
    # 2^10: (1e6 x 2 + 3e6 x 3) / 4e6 = 2.75; 2^14: C alone, 1.0 (D does not count).
    assert scale_scores(rows) == pytest.approx({SMALL: 2.75, LARGE: 1.0})
    unweighted = (2.0 + 3.0 + 1.0) / 3
    assert suite_score(rows) != pytest.approx(unweighted)  # the large-FLOP card moves the score most


def test_nothing_counted_has_no_score_and_the_vendor_wins_are_ours_faster() -> None:
    assert suite_score(score_cards([D])) is None and scale_scores(score_cards([D])) == {}
    wins = beats_vendor(score_cards([A, B, C]))
    assert [w.task for w in wins] == ["b"]
