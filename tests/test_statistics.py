"""Bootstrap intervals of speedups: a real gain is told apart from timing noise."""

from __future__ import annotations

import numpy as np

from kernelforge_tui.gpu.statistics import improvement_interval, robust_stats, speedup_interval
from kernelforge_tui.models.evaluation import Timing


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
    assert wide is not None and narrow is not None
    assert wide[0] < 2.0 < wide[1]
    assert narrow[0] < 2.0 < narrow[1]
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 3


def test_a_gain_inside_the_noise_is_not_an_improvement_and_a_clear_one_is() -> None:
    best = _pair(50.0, 100.0, 0.03, seed=2)
    same = _pair(49.5, 100.0, 0.03, seed=3)  # 1% faster, with 3% noise per launch
    clear = _pair(40.0, 100.0, 0.03, seed=4)  # 25% faster
    tie = improvement_interval(same, best)
    gain = improvement_interval(clear, best)
    assert tie is not None and gain is not None
    assert tie[0] < 1.0 < tie[1]
    assert gain[0] > 1.15


def test_the_drift_shared_by_a_pair_cancels_out() -> None:
    """Paired resampling: the same drift on both sides of a pair does not widen the interval."""
    n = 40
    drift = list(100 * (1 + 0.3 * np.sin(np.linspace(0, 6, n))))
    cand = robust_stats([d / 2 for d in drift])
    base = robust_stats(drift)
    interval = speedup_interval(cand, base)
    assert interval is not None
    assert interval[1] - interval[0] < 1e-9


def test_without_samples_there_is_no_interval() -> None:
    bare = Timing(median_us=10.0, p10_us=9.0, p90_us=11.0, cv=0.01, reps=20)
    assert speedup_interval(bare, bare) is None
    assert improvement_interval((bare, bare), _pair(5.0, 10.0, 0.01, seed=5)) is None
