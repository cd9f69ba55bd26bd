"""The GPU worker's pure parts: what fills the outputs before each launch, how compare counts read as a verdict,
timing statistics, and device memory sizes.

Why apart from `worker.py`: nothing here touches CUDA, so every rule the worker applies (which prefill a run
gets, what a reason says, when timing has settled) is tested on any machine; the worker only moves bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from kernelforge_tui.cards.dtypes import FLOATING, NUMPY
from kernelforge_tui.cards.model import OperatorCard, Tolerance
from kernelforge_tui.gpu.statistics import robust_stats, speedup_interval
from kernelforge_tui.vocabulary.evaluation import EvalResult, SetCheck


class Prefill(StrEnum):
    """What an output buffer holds when a candidate starts: a kernel must overwrite it, never read it."""

    POISON = "poison"
    """NaN for floats (an unlikely pattern for integers): an element left unwritten shows as NaN."""
    STALE = "stale"
    """Another input set's reference outputs: a kernel that keeps what it finds returns a plausible wrong answer."""
    NOISE = "noise"
    """Random finite values, drawn afresh on the GPU for each launch (`kf_noise_<dtype>`): a kernel that reads its
    output first (treating NaN as "empty") is thrown off, and no launch's prefill repeats another's."""


@dataclass(frozen=True)
class Fill:
    """The prefill of one launch, with the input set whose references a STALE prefill copies."""

    prefill: Prefill
    stale_set: int | None = None


FIRST_RUN = Fill(Prefill.POISON)
"""Every set's first checked run starts from the poison, so unwritten elements are named as such."""
SECOND_RUN = Prefill.STALE
"""The second run on the first set starts from another set's results: same inputs, different buffer."""


FRESH_PREFIX = "fresh-"
"""Names of the fresh sets the worker draws for each card (`fresh-0`, `fresh-1`, ...)."""


def stale_source(set_names: Sequence[str]) -> int | None:
    """The set whose references STALE prefills copy: the first fresh set (drawn like the card's own sets, so a
    plausible answer for other inputs, never a stress set of special values), else the card's second set;
    None when there is only one set."""
    fresh = [index for index, name in enumerate(set_names) if name.startswith(FRESH_PREFIX)]
    if fresh:
        return fresh[0]
    return 1 if len(set_names) > 1 else None


def fill_for(prefill: Prefill, stale_set: int | None) -> Fill:
    """The fill of one launch; STALE without another set to copy from falls back to noise."""
    if prefill is not Prefill.STALE:
        return Fill(prefill)
    if stale_set is None:
        return Fill(Prefill.NOISE)
    return Fill(Prefill.STALE, stale_set)


def timed_fill(launch: int, stale_set: int | None) -> Fill:
    """Timed launches of the candidate alternate stale results and fresh noise, starting with stale results: every
    one is checked, so one that keeps a plausible output (another set's) fails as surely as one that keeps noise."""
    return fill_for(Prefill.NOISE if launch % 2 else Prefill.STALE, stale_set)


def describe(fill: Fill, set_names: Sequence[str]) -> str:
    """The prefill in words, for a failure's reason."""
    if fill.prefill is Prefill.POISON:
        return "the NaN poison"
    if fill.prefill is Prefill.NOISE:
        return "random finite values"
    assert fill.stale_set is not None
    return f"set {set_names[fill.stale_set]}'s reference outputs"


# -- verdicts ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareCounts:
    """What the `kf_compare_*` helper kernel counted over one floating-point output. Each bad element is of one
    kind: the poison's bits, a NaN, an inf (those three where the reference is finite), wrong where the
    reference is NaN or inf, or else a finite value outside the tolerance."""

    bad: int
    first_bad: int
    max_abs: float
    max_ratio: float
    poisoned: int = 0
    """Still the poison's exact bits (whatever the launch started from) where the reference is finite."""
    nan_out: int = 0
    """Other NaN where the reference is finite: NaN the kernel computed."""
    inf_out: int = 0
    """+-inf where the reference is finite."""
    special: int = 0
    """Wrong where the reference is NaN or inf (a finite value, or another NaN/inf)."""

    @classmethod
    def from_words(cls, words: np.ndarray) -> CompareCounts:
        """Decode the helper's CompareResult: bad, nan_out, first_bad, two doubles stored as their bits, then
        poisoned, inf_out, special."""
        max_abs, max_ratio = words[3:5].astype(np.uint64).view(np.float64)
        return cls(
            bad=int(words[0]),
            first_bad=int(words[2]),
            max_abs=float(max_abs),
            max_ratio=float(max_ratio),
            poisoned=int(words[5]),
            nan_out=int(words[1]),
            inf_out=int(words[6]),
            special=int(words[7]),
        )

    @property
    def outside(self) -> int:
        """Finite values outside the tolerance where the reference is finite: the bad of no other kind."""
        return self.bad - self.poisoned - self.nan_out - self.inf_out - self.special


def add_float_output(
    check: SetCheck, name: str, dims: tuple[int, ...], tol: Tolerance, counts: CompareCounts, fill: Fill
) -> None:
    """Fold one floating-point output's counts into the set's check, with a reason that says what went wrong.

    The poison's bits mean "never written" only when the launch started from the poison; otherwise the kernel
    wrote that NaN, and it counts with the other NaN."""
    numel = math.prod(dims)
    unwritten = counts.poisoned if fill.prefill is Prefill.POISON else 0
    check.numel += numel
    check.bad += counts.bad
    check.unwritten += unwritten
    check.max_abs_error = max(check.max_abs_error, counts.max_abs)
    check.max_error_ratio = max(check.max_error_ratio, counts.max_ratio)
    if not counts.bad:
        return
    check.ok = False
    check.first_bad_index = counts.first_bad
    if unwritten == numel:
        check.reason = f"{name} was never written (all {numel} elements still hold the NaN poison)"
        return
    kinds = [
        (unwritten, "never written (still the NaN poison's bits)"),
        (counts.nan_out + counts.poisoned - unwritten, "NaN where the reference is finite"),
        (counts.inf_out, "inf where the reference is finite"),
        (counts.special, "wrong where the reference is NaN or inf"),
        (
            counts.outside,
            f"outside rtol={tol.rtol:g}, atol={tol.atol:g} (worst {counts.max_ratio:.3g}x the tolerance)",
        ),
    ]
    found = [(count, what) for count, what in kinds if count]
    summary = found[0][1] if len(found) == 1 else "wrong: " + ", ".join(f"{count} {what}" for count, what in found)
    where = f"first at index {counts.first_bad}{row_of(counts.first_bad, dims)}"
    check.reason = f"{name}: {counts.bad} of {numel} elements {summary} ({where})"


def add_exact_output(check: SetCheck, name: str, numel: int, itemsize: int, bad_bytes: int, first_byte: int) -> None:
    """Fold one integer output's byte comparison into the set's check (integers must match exactly)."""
    check.numel += numel
    if not bad_bytes:
        return
    check.ok = False
    check.bad += max(1, bad_bytes // itemsize)
    check.first_bad_index = first_byte // itemsize
    check.reason = f"{name}: integer output differs from the reference"


def set_check(spec: OperatorCard, name: str, fill: Fill, records: np.ndarray) -> SetCheck:
    """One launch's check from the helpers' records, one per output in the card's order (a CompareResult for a
    floating-point output, kf_count_diff's count and first byte for an integer one); `fill`: what the outputs held
    before the launch."""
    check = SetCheck(name=name, ok=True)
    for tensor, words in zip(spec.outputs, records, strict=True):
        if tensor.dtype in FLOATING:
            counts = CompareCounts.from_words(words)
            add_float_output(check, tensor.name, tensor.dims(spec.sizes), tensor.effective_tolerance(), counts, fill)
        else:
            numel, itemsize = tensor.numel(spec.sizes), NUMPY[tensor.dtype].itemsize
            add_exact_output(check, tensor.name, numel, itemsize, int(words[0]), int(words[1]))
    return check


@dataclass(frozen=True)
class WrongLaunch:
    """A timed launch whose output was wrong: its number (from 1, in timing order), its prefill, its check."""

    number: int
    fill: Fill
    check: SetCheck


SHOWN_LAUNCHES = 8
"""Wrong timed launches a reason lists by number."""


def timed_failure(wrong: Sequence[WrongLaunch], timed: int, set_names: Sequence[str]) -> str:
    """The reason of a candidate whose output was wrong on some timed launches, when every checked run before
    the timing was right: it behaves differently on some launches (a launch counter, a clock, what the buffer
    held)."""
    numbers = ", ".join(str(w.number) for w in wrong[:SHOWN_LAUNCHES])
    if len(wrong) > SHOWN_LAUNCHES:
        numbers += ", ..."
    first = wrong[0]
    return (
        f"{len(wrong)} of its {timed} timed launches gave a wrong output (launch {numbers}), though every run "
        f"before the timing was right; launch {first.number}, started from {describe(first.fill, set_names)}: "
        f"{first.check.reason}"
    )


def row_of(index: int, dims: tuple[int, ...]) -> str:
    if len(dims) < 2:
        return ""
    return f", row {index // math.prod(dims[1:])}"


# -- timing ----------------------------------------------------------------------------------------------------


def add_timings(result: EvalResult, samples: dict[str, list[float]], bytes_moved: int, flops: int) -> None:
    """The candidate's (and baseline's) timing from the interleaved samples, the speedup, the achieved rates."""
    result.candidate = robust_stats(samples["candidate"])
    if "baseline" in samples:
        result.baseline = robust_stats(samples["baseline"])
        result.speedup = result.baseline.median_us / result.candidate.median_us
        result.speedup_interval = speedup_interval(result.candidate, result.baseline)
    seconds = result.candidate.median_us * 1e-6
    if bytes_moved:
        result.achieved_gbps = bytes_moved / seconds / 1e9
    if flops:
        result.achieved_tflops = flops / seconds / 1e12


# -- memory ----------------------------------------------------------------------------------------------------


def bytes_needed(spec: OperatorCard, n_sets: int, flush_bytes: int) -> int:
    """Device memory for a loaded card: per set working and pristine inputs and references; the outputs and the
    first run's copy of them; the L2 flush scratch."""
    ins = sum(t.nbytes(spec.sizes) for t in spec.inputs)
    outs = sum(t.nbytes(spec.sizes) for t in spec.outputs)
    return n_sets * (2 * ins + outs) + 2 * outs + flush_bytes
