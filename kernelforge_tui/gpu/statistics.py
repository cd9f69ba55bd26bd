"""Timing statistics: robust summaries of event-timed launches and bootstrap intervals of speedups.

Why intervals: two kernels a few percent apart swap places from one measurement to the next, and a search
that promotes whichever was timed faster last fills its history with noise. A speedup counts as real only
when a bootstrap over the interleaved samples puts its whole 95% interval above the bar. Samples are paired:
candidate and baseline sample i ran side by side, so resampling pairs keeps the drift they share (clocks,
temperature) out of the ratio. The resampling is seeded, so the same samples always give the same verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kernelforge_tui.vocabulary.evaluation import Timing

CONFIDENCE = 0.95
RESAMPLES = 2000
_SEED = 20261130


def robust_stats(samples: Sequence[float]) -> Timing:
    values = np.asarray(samples, dtype=np.float64)
    median = float(np.median(values))
    q10, q25, q75, q90 = np.percentile(values, [10, 25, 75, 90])
    return Timing(
        median_us=median,
        p10_us=float(q10),
        p90_us=float(q90),
        cv=float((q75 - q25) / 1.349 / median) if median > 0 else 0.0,
        reps=len(values),
        samples_us=[float(v) for v in values],
    )


def median_settled(samples: Sequence[float], target: float) -> bool:
    """The standard error of the median (1.2533 sigma / sqrt n, sigma from the IQR) is under target."""
    stats = robust_stats(samples)
    return 1.2533 * stats.cv / math.sqrt(len(samples)) < target


def _boot_speedups(candidate: Timing, baseline: Timing, rng: np.random.Generator) -> np.ndarray | None:
    """Resampled speedups (baseline median over candidate median) over the paired samples."""
    n = min(len(candidate.samples_us), len(baseline.samples_us))
    if n < 2:
        return None
    cand = np.asarray(candidate.samples_us[:n])
    base = np.asarray(baseline.samples_us[:n])
    picks = rng.integers(0, n, size=(RESAMPLES, n))
    speedups: np.ndarray = np.median(base[picks], axis=1) / np.median(cand[picks], axis=1)
    return speedups


def _interval(values: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


_Z = 1.959964
"""Two-sided 95% normal quantile, for timings stored without their samples."""


def _log_median_se(timing: Timing) -> float:
    """Standard error of log(median) from the summary alone: 1.2533 sigma / sqrt(n), sigma from the IQR."""
    return 1.2533 * timing.cv / math.sqrt(max(timing.reps, 1))


def _summary_interval(log_ratio: float, *timings: Timing) -> tuple[float, float]:
    """A normal interval on the log scale from the summaries (no pairing assumed, so never narrower)."""
    se = math.sqrt(sum(_log_median_se(t) ** 2 for t in timings))
    return math.exp(log_ratio - _Z * se), math.exp(log_ratio + _Z * se)


def speedup_interval(candidate: Timing, baseline: Timing) -> tuple[float, float]:
    """The 95% interval of the candidate's speedup over its baseline.

    A bootstrap over the paired samples; a timing stored without its samples (a run of an older version)
    gets the normal interval its median's standard error gives.
    """
    boot = _boot_speedups(candidate, baseline, np.random.default_rng(_SEED))
    if boot is not None:
        return _interval(boot)
    return _summary_interval(math.log(baseline.median_us / candidate.median_us), candidate, baseline)


def improvement_interval(new: tuple[Timing, Timing], best: tuple[Timing, Timing]) -> tuple[float, float]:
    """The 95% interval of new speedup / best speedup, each (candidate, baseline) measured side by side.

    The two were measured in different evaluations, so each is resampled on its own; the baseline in each
    pair cancels the drift between the two evaluations. Without samples: the summaries' normal interval.
    """
    rng = np.random.default_rng(_SEED)
    new_boot = _boot_speedups(*new, rng)
    best_boot = _boot_speedups(*best, rng)
    if new_boot is not None and best_boot is not None:
        return _interval(new_boot / best_boot)
    (new_cand, new_base), (best_cand, best_base) = new, best
    log_ratio = math.log(new_base.median_us / new_cand.median_us) - math.log(best_base.median_us / best_cand.median_us)
    return _summary_interval(log_ratio, new_cand, new_base, best_cand, best_base)
