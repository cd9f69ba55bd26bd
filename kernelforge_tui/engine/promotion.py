"""Who is the run's best: a challenger replaces it only when it is faster beyond the timing noise.

Why: candidates a percent or two apart trade places from one measurement to the next, so "highest speedup
seen" crowns whichever was timed on a lucky launch, and the history of bests fills with noise. A node is
promoted only when the 95% interval of its speedup over the current best's (a paired bootstrap over each
one's interleaved samples, `gpu.statistics`) lies wholly above 1. A faster-looking node that is not
promoted is said so in the log, with the interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelforge_tui.gpu.statistics import improvement_interval
from kernelforge_tui.vocabulary.evaluation import Evaluation, Timing

Pair = tuple[Timing, Timing]
"""(candidate, baseline) timings measured side by side in one evaluation."""


@dataclass(frozen=True)
class Verdict:
    """The decision on one measured node that looked faster than the best."""

    promoted: bool
    gain: tuple[float, float] | None
    """95% interval of its speedup over the previous best's; None for the first best or without timings."""
    text: str


def timed_pair(evaluation: Evaluation | None) -> Pair | None:
    """The side-by-side timings of an evaluation, where it has both."""
    result = evaluation.result if evaluation is not None else None
    if result is None or result.candidate is None or result.baseline is None:
        return None
    return result.candidate, result.baseline


class Champion:
    """The current best node and the bar a challenger has to clear."""

    def __init__(self, node_id: int | None = None, speedup: float | None = None, pair: Pair | None = None) -> None:
        self.node_id = node_id
        self.speedup = speedup
        self._pair = pair

    def consider(self, node_id: int, speedup: float | None, pair: Pair | None) -> Verdict | None:
        """None when the node is not faster than the best even by its point estimate (or was not timed)."""
        if speedup is None:
            return None
        if self.node_id is None or self.speedup is None:
            return self._crown(node_id, speedup, pair, None, "the first timed node")
        if speedup <= self.speedup:
            return None
        if pair is None or self._pair is None:
            return self._crown(node_id, speedup, pair, None, "no samples to judge the noise by")
        low, high = improvement_interval(pair, self._pair)
        gain = f"{speedup / self.speedup:.3f}x node {self.node_id}'s speedup (95% interval {low:.3f}-{high:.3f})"
        if low > 1.0:
            return self._crown(node_id, speedup, pair, (low, high), gain)
        return Verdict(
            promoted=False, gain=(low, high), text=f"{gain}: within the noise, node {self.node_id} stays the best"
        )

    def _crown(
        self, node_id: int, speedup: float, pair: Pair | None, gain: tuple[float, float] | None, why: str
    ) -> Verdict:
        self.node_id, self.speedup, self._pair = node_id, speedup, pair
        return Verdict(promoted=True, gain=gain, text=why)
