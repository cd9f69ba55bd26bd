"""Bootstrap intervals of speedups: a real gain is told apart from timing noise."""

from __future__ import annotations

import numpy as np

from kernelforge_tui.gpu.statistics import improvement_interval, robust_stats, speedup_interval
from kernelforge_tui.vocabulary.evaluation import Timing


def _pair(candidate_us: float, baseline_us: float, noise: float, seed: int, n: int = 40) -> tuple[Timing, Timing]:
    """Candidate and baseline samples taken side by side, sharing a slow drift as a real GPU's clocks do."""
    rng = np.random.default_rng(seed)
    drift = 1 + 0.02 * np.sin(np.linspace(0, 3, n))
    cand = candidate_us * drift * (1 + rng.normal(0, noise, n))
    base = baseline_us * drift * (1 + rng.normal(0, noise, n))
    return robust_stats(list(cand)), robust_stats(list(base))


def test_the_speedup_interval_holds_the_true_speedup_and_narrows_with_less_noise() -> None:
    wide = speedup_interval(*_pair(50.0, 100.0, 0.05, seed=1))
    narrow = speedup_interval(*_pair(50.0, 100.0, 0.005, seed=1))
    assert wide[0] < 2.0 < wide[1]
    assert narrow[0] < 2.0 < narrow[1]
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 3


def test_a_gain_inside_the_noise_is_not_an_improvement_and_a_clear_one_is() -> None:
    best = _pair(50.0, 100.0, 0.03, seed=2)
    same = _pair(49.5, 100.0, 0.03, seed=3)  # 1% faster, with 3% noise per launch
    clear = _pair(40.0, 100.0, 0.03, seed=4)  # 25% faster
    tie = improvement_interval(same, best)
    gain = improvement_interval(clear, best)
    assert tie[0] < 1.0 < tie[1]
    assert gain[0] > 1.15


def test_the_drift_shared_by_a_pair_cancels_out() -> None:
    """Paired resampling: the same drift on both sides of a pair does not widen the interval."""
    n = 40
    drift = list(100 * (1 + 0.3 * np.sin(np.linspace(0, 6, n))))
    cand = robust_stats([d / 2 for d in drift])
    base = robust_stats(drift)
    interval = speedup_interval(cand, base)
    assert interval[1] - interval[0] < 1e-9


def test_timings_stored_without_samples_get_the_interval_their_summary_gives() -> None:
    """Runs of older versions kept only median, IQR-based cv and reps: the interval comes from those."""
    sampled = _pair(50.0, 100.0, 0.02, seed=5)
    bare = tuple(t.model_copy(update={"samples_us": []}) for t in sampled)
    low, high = speedup_interval(*bare)
    assert low < sampled[1].median_us / sampled[0].median_us < high
    noisier = tuple(t.model_copy(update={"cv": t.cv * 4}) for t in bare)
    wide_low, wide_high = speedup_interval(*noisier)
    assert wide_high - wide_low > 3 * (high - low)
    same_low, same_high = improvement_interval((bare[0], bare[1]), (bare[0], bare[1]))
    assert same_low < 1.0 < same_high
