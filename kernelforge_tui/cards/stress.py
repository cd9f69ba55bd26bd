"""Stress input sets: the inputs on which a kernel that is right on ordinary data goes wrong.

A card's distribution-matched sets (stored, seeded, fresh) look like its real data, and a kernel that is
right only there passes them: a softmax without its max subtraction is exact on normal(0, 2) logits and
NaN on logits above 88. So each op family writes down here which hard inputs its operator is defined on,
and why (`FAMILIES`), and why the others do not apply. A card runs every stress set of its family, with
the card's own shapes and dtypes, drawn from `[stress] seed` and referenced by the card's NumPy reference
(in float64 where the built-ins compute, then rounded to the output dtype), unless `[stress.skip]` names
the set with a reason. Nothing is listed per card, so a set added to a family applies to every card.

Stress values go into the family's data tensors (the first input; every input for elementwise ops), one
row at a time, where a row is the span one statistic covers (the last axis; a (sample, group) for group
norm; a plane for pooling; one element for elementwise ops). Weights keep the card's distribution.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from kernelforge_tui.cards.dtypes import FLOATING, NUMPY, float_limits
from kernelforge_tui.cards.errors import FieldProblem

if TYPE_CHECKING:
    from kernelforge_tui.cards.model import OperatorCard, TensorSpec

Arrays = dict[str, np.ndarray]

F32_MAX = float_limits("float32")[0]
LOGIT_LIMIT = 1e4
"""Softmax logits reach +-1e4: far past exp's fp32 range (88.7), and a max-subtracted softmax is still exact
there (the entries that matter lie within ~100 of the max, where x - max is exact in fp32)."""
MEAN_GRID = 192
"""large-mean rows are 2^e * (192 + j), e in 0..6, with spread(j) = 192 / K: j a rounded normal within 4 of its
spreads, or, where the spread is under half a step, +-1 in a share spread^2 of the entries (how a large mean
looks in bf16: most values equal, some one step off). 8-bit integers times a power of two: bf16 holds them
exactly, and an fp32 sum of a row is exact for rows under 2^24 / 255 = 65793 elements (the only rounding an
honest kernel does is its own). e >= 0 keeps the variance (0.035 at least) far above a norm's eps: this set is
about cancellation; equal-rows is about eps."""
EQUAL_VALUES = (0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1000.0, -1000.0, 2.0**-10, 2.0**-20, 12288.0)
"""Constant rows: values whose multiples are exact in fp32, so a mean of a constant row is exactly its value
(a random constant's fp32 mean is off by an ulp, which eps then magnifies beyond any tolerance)."""


@dataclass(frozen=True)
class Limits:
    """The magnitudes a data tensor's dtype holds and its family's arithmetic allows."""

    largest: float
    """The largest magnitude the family is defined on for this tensor (at most the dtype's max)."""
    mean_over_spread: float
    """large-mean's K: atol * 2^24 / 8, within 12.8..1024. An honest fp32 kernel's mean is off by about 2^-24 * K
    spreads (a few times that after a long sum), an absolute error every output carries: it decides where b
    cancels the normalised term and only atol applies, so K keeps it near an eighth of atol. Computing
    var = E[x^2] - E[x]^2 instead loses about 2^-24 * K^2 of the variance: K times more. 21 at atol 1e-5
    (fp32 cards), 1024 at 1e-3 (bf16)."""
    constant_largest: float
    """The largest magnitude of an equal-rows constant (at most `largest`; see `Family.constant_largest`)."""
    max: float
    smallest_normal: float
    smallest_subnormal: float


Maker = Callable[[np.ndarray, np.random.Generator, Limits], None]
"""Writes a set's values into rows (a 2-D view of a data tensor, float32 or float64) in place."""


def _some_rows(rng: np.random.Generator, rows: int, share: float) -> np.ndarray:
    """A random `share` of the rows (a boolean mask), at least one."""
    chosen = rng.random(rows) < share
    if not chosen.any():
        chosen[rng.integers(rows)] = True
    return chosen


BLOCKWISE_PATTERNS_FROM = 1 << 20
"""From this many rows on, `_patterns` orders each run of `count` rows at random instead of permuting all of them."""


def _patterns(rng: np.random.Generator, rows: int, count: int) -> np.ndarray:
    """Pattern 0..count-1 of each row: as many rows of each (give or take one), in random places. From
    BLOCKWISE_PATTERNS_FROM rows on, each run of `count` rows holds every pattern once, in an order drawn from
    every order of them: a permutation of every row took 8.4 s for 2^26 rows here (0.85 s this way), and an
    elementwise card's rows are its elements (2^28 for the H200's gelu card)."""
    if rows < BLOCKWISE_PATTERNS_FROM:
        return rng.permutation(rows) % count
    orders = np.array(list(itertools.permutations(range(count))), dtype=np.int8)
    return orders[rng.integers(len(orders), size=-(-rows // count))].ravel()[:rows]


def _log_uniform(rng: np.random.Generator, low: float, high: float, count: int) -> np.ndarray:
    return np.exp(rng.uniform(math.log(low), math.log(max(low, high)), count))


def _signs(rng: np.random.Generator, count: int) -> np.ndarray:
    return np.where(rng.random(count) < 0.5, -1.0, 1.0)


def _large_logits(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    rows = x.shape[0]
    top = min(LOGIT_LIMIT, lim.largest)
    x *= np.where(rng.random(rows) < 1 / 3, _log_uniform(rng, 1.0, 1e3, rows), 1.0)[:, None]
    x += (_signs(rng, rows) * _log_uniform(rng, 10.0, top, rows))[:, None]
    np.clip(x, -top, top, out=x)


def _masked(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    rows, cols = x.shape
    col = np.arange(cols)
    pattern = _patterns(rng, rows, 4)
    mask = np.empty(x.shape, dtype=bool)
    chosen = pattern == 0  # a random 10-99% of the entries
    mask[chosen] = rng.random((int(chosen.sum()), cols), dtype=np.float32) < rng.uniform(0.1, 0.99, (chosen.sum(), 1))
    chosen = pattern == 1  # causal: the first k entries stay
    mask[chosen] = col >= rng.integers(1, cols + 1, (chosen.sum(), 1))
    chosen = pattern == 2  # left padding: the entries from k on stay
    mask[chosen] = col < rng.integers(0, cols, (chosen.sum(), 1))
    chosen = pattern == 3  # all but one
    mask[chosen] = col != rng.integers(0, cols, (chosen.sum(), 1))
    full = np.flatnonzero(mask.all(axis=1))  # a random mask can take a whole row: give one entry back
    mask[full, rng.integers(0, cols, full.size)] = False
    x[mask] = -np.inf


def _fully_masked(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    _masked(x, rng, lim)
    x[_some_rows(rng, x.shape[0], 0.25)] = -np.inf


def _equal_rows(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    top = 2.0 ** math.floor(math.log2(lim.constant_largest))
    values = [v for v in EQUAL_VALUES if abs(v) <= top] + [top, -top]
    x[:] = rng.permutation(np.resize(np.array(values), x.shape[0]))[:, None]


def _zero_rows(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    x[_some_rows(rng, x.shape[0], 0.5)] = 0.0


def _tiny(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    """Rows scaled near eps, near the smallest normal, or anywhere down to the subnormals, a third each (each
    band's scales drawn for its own rows only: a 180M-element card's rows are its elements)."""
    bands = (
        (1e-4, 1e-2),
        (lim.smallest_normal / 16, lim.smallest_normal * 16),
        (lim.smallest_subnormal * 4, 1e-2),
    )
    band = _patterns(rng, x.shape[0], len(bands))
    scale = np.empty(x.shape[0])
    for k, (low, high) in enumerate(bands):
        chosen = band == k
        scale[chosen] = _log_uniform(rng, low, high, int(np.count_nonzero(chosen)))
    x *= scale[:, None]


def _large(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    x *= _log_uniform(rng, 10.0, lim.largest / 8, x.shape[0])[:, None]
    np.clip(x, -lim.largest, lim.largest, out=x)


def _large_mean(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    rows = x.shape[0]
    spread = MEAN_GRID / lim.mean_over_spread
    if spread >= 0.5:
        steps = np.clip(np.rint(rng.standard_normal(x.shape) * spread), -4 * spread, 4 * spread)
    else:
        steps = np.where(rng.random(x.shape) < spread**2, _signs(rng, x.size).reshape(x.shape), 0.0)
    top = math.floor(math.log2(lim.largest / 255))
    unit = _signs(rng, rows) * np.exp2(rng.integers(min(0, top), min(6, top) + 1, rows))
    x[:] = (MEAN_GRID + steps) * unit[:, None]


def _max_finite(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    rows, cols = x.shape
    pattern = _patterns(rng, rows, 3)
    one = np.flatnonzero(pattern == 0)
    x[one, rng.integers(0, cols, one.size)] = lim.max
    some = np.flatnonzero(pattern == 1)
    hit_rows, hit_cols = np.nonzero(rng.random((some.size, cols)) < 0.25)
    x[some[hit_rows], hit_cols] = _signs(rng, hit_rows.size) * lim.max
    x[pattern == 2] = lim.max


OUTLIER_SPREADS = 1000
"""An outlier lies OUTLIER_SPREADS * sqrt(row length) of its row's spreads away: the row's variance is then its own,
and moments summed about it cancel by about the row length (see `_outliers`)."""


def _outliers(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    """One entry a row moved far off: the first in half of the rows (a kernel that sums its moments about the row's
    first entry, E[d^2] - E[d]^2 of d = x - x[0], cancels there by the row length), any other in the rest."""
    rows, cols = x.shape
    spread = x.std(axis=1)
    magnitude = np.minimum(OUTLIER_SPREADS * math.sqrt(cols) * np.where(spread > 0, spread, 1.0), lim.largest)
    where = np.where(_patterns(rng, rows, 2) == 0, 0, rng.integers(0, cols, rows))
    x[np.arange(rows), where] = x.mean(axis=1) + _signs(rng, rows) * magnitude


def _nan_inf(x: np.ndarray, rng: np.random.Generator, lim: Limits) -> None:
    rows, cols = x.shape
    pattern = _patterns(rng, rows, 4)
    for k, value in enumerate((np.nan, np.inf, -np.inf)):
        chosen = np.flatnonzero(pattern == k)
        x[chosen, rng.integers(0, cols, chosen.size)] = value


@dataclass(frozen=True)
class Kind:
    """One kind of stress input: what its rows hold, and the code that writes them."""

    holds: str
    make: Maker


KINDS: dict[str, Kind] = {
    "large-logits": Kind(
        "rows shifted by +-10 to +-1e4 over the card's own values (a third also stretched up to 1000x), "
        "clipped to +-1e4",
        _large_logits,
    ),
    "masked": Kind(
        "-inf as attention masks write it, a pattern per row in turn: a random 10-99% of the entries, a "
        "causal suffix, a left-padding prefix, all entries but one",
        _masked,
    ),
    "fully-masked": Kind("a quarter of the rows entirely -inf, the others as in masked", _fully_masked),
    "equal-rows": Kind(
        "every row one value: 0, +-1, 0.5, -2.5, 3, +-1000, 2^-10, 2^-20, 12288 and +-the largest power of "
        "two the family allows (2^30 at most for layer and group norm: see SCALED_CONSTANT)",
        _equal_rows,
    ),
    "zero-rows": Kind("half of the rows all zero, the others the card's own", _zero_rows),
    "tiny": Kind(
        "rows scaled down: a third to 1e-4..1e-2 (mean(x^2) near a norm's eps), a third around the smallest "
        "normal (about half of them subnormal), a third anywhere from 4 smallest subnormals to 1e-2",
        _tiny,
    ),
    "large": Kind("rows scaled by 10 up to an eighth of the largest magnitude the family allows", _large),
    "large-mean": Kind(
        "rows of +-2^e * (192 + j), e in 0..6, j spread by 192 / K (a rounded normal, or +-1 in a few entries "
        "when that is under half a step): mean / spread = K, as large as the card's atol lets an honest fp32 "
        "kernel be (21 at atol 1e-5, 1024 at 1e-3)",
        _large_mean,
    ),
    "max-finite": Kind(
        "the dtype's largest finite value: one entry of a row, a quarter of a row's entries (either sign), "
        "or a whole row",
        _max_finite,
    ),
    "outliers": Kind(
        "one entry a row 1000 * sqrt(row length) of the row's spreads off its mean: the row's first entry in half "
        "of the rows, any entry in the rest",
        _outliers,
    ),
    "nan-inf": Kind("one NaN, +inf or -inf in three rows of every four", _nan_inf),
}

Arithmetic = Literal["dtype", "sums", "squares"]
"""What bounds the magnitudes a family is defined on: the dtype's range, an fp32 sum over a row, or an fp32
sum of squares over a row (sums are fp32 for 16- and 32-bit data, as torch computes them)."""


def _last_axis(card: OperatorCard, tensor: TensorSpec) -> int:
    return tensor.dims(card.sizes)[-1]


def _element(card: OperatorCard, tensor: TensorSpec) -> int:
    return 1


def _per_output(card: OperatorCard, tensor: TensorSpec) -> int:
    """Pooling: the plane each output element averages."""
    numel, outputs = tensor.numel(card.sizes), card.outputs[0].numel(card.sizes)
    return numel // outputs if numel % outputs == 0 else _last_axis(card, tensor)


def _per_group(card: OperatorCard, tensor: TensorSpec) -> int:
    """Group norm: one (sample, group) span, contiguous in NCHW."""
    numel, spans = tensor.numel(card.sizes), tensor.dims(card.sizes)[0] * card.sizes.get("groups", 1)
    return numel // spans if numel % spans == 0 else _last_axis(card, tensor)


@dataclass(frozen=True)
class Family:
    """Which stress sets an op family runs and why, and why it does not run the others."""

    applies: dict[str, str]
    skips: dict[str, str]
    arithmetic: Arithmetic
    row: Callable[[OperatorCard, TensorSpec], int] = _last_axis
    every_input: bool = False
    """Stress values go into every input (elementwise ops), not only the first."""
    constant_largest: float = math.inf
    """The largest constant of an equal-rows row, where the operator's own formulation bounds it below `largest`."""
    span: Callable[[OperatorCard, TensorSpec], int] | None = None
    """The length of the sums that bound the magnitudes (`arithmetic`), where that is not the row the values are
    written by: a convolution's window, cg * kh * kw, runs across rows of x."""


NOT_SOFTMAX = "-inf is a mask only for softmax; nan-inf holds +-inf for the others"
NO_MAX_FINITE = (
    "the fp32 {what} overflows there where a float64 reference does not, and the operator's contract is fp32 "
    "arithmetic (as torch computes it for 16-bit data): no honest kernel could agree; large goes up to the "
    "fp32 limit instead"
)
NORM = {
    "large-mean": "var = E[x^2] - E[x]^2 cancels: at mean / spread K fp32 loses 2^-24 * K^2 of the variance, "
    "several times the card's tolerance, while a two-pass or Welford kernel stays well within it",
    "equal-rows": "the variance is 0 and eps decides: y = b exactly; without eps 0 * rsqrt(0) = NaN, and a "
    "cancelling variance can go negative (rsqrt of it: NaN)",
    "large": "squares overflow fp16 arithmetic beyond 256 and half-precision sums lose the row; fp32 is "
    "exact enough up to 2^-4 * sqrt(FLT_MAX / row length)",
    "tiny": "the variance underflows in fp32 or sits near eps: eps decides",
    "outliers": "the variance is the outlier's: moments summed about one entry of the row (its first, a cheap "
    "shift) cancel by about the row length unless the kernel centres them again; two-pass and Welford kernels lose "
    "nothing",
    "nan-inf": "a NaN or +-inf makes the mean NaN or inf and the whole row NaN, as torch gives",
}
NORM_SKIPS = {
    "large-logits": "not a softmax: large covers magnitude",
    "masked": NOT_SOFTMAX,
    "fully-masked": NOT_SOFTMAX,
    "zero-rows": "a zero row is one of the equal-rows",
    "max-finite": NO_MAX_FINITE.format(what="sum of squares"),
}
NO_SPREAD = "no variance: one large entry is an ordinary input (large covers magnitude)"
SUMS = {
    "large": "fp32 sums stay exact enough up to 2^-4 * FLT_MAX / row length; half-precision accumulators do not",
    "tiny": "tiny and subnormal outputs: flushing subnormals to zero is within atol, anything worse is not",
    "nan-inf": "NaN and +-inf propagate into every output that sums them (+inf and -inf together: NaN)",
}
SUMS_SKIPS = {
    "large-logits": "not a softmax: large covers magnitude",
    "masked": NOT_SOFTMAX,
    "fully-masked": NOT_SOFTMAX,
    "equal-rows": "nothing divides by a spread: a constant is an ordinary input",
    "zero-rows": "nothing divides by a spread: zeros are ordinary inputs",
    "large-mean": "no variance: an average loses nothing to a large mean",
    "outliers": NO_SPREAD,
    "max-finite": NO_MAX_FINITE.format(what="sum"),
}
SCALED_CONSTANT = 2.0**30
"""Layer and group norm constants stop at 2^30: torch computes them as x * (rstd * w) + (b - mean * rstd * w),
and on a constant row rstd = 1/sqrt(eps) (316 at 1e-5), so x * rstd * w cancels against mean * rstd * w in the
arithmetic's last bits: at 2^56 even a float64 reference loses b entirely (ulp(2^56 * 316) = 4096), while at
2^30 its error stays near 1e-4, under every card's atol. Larger magnitudes are covered by `large`."""
NONE_YET = "no stress inputs are written for this family yet"


def _window(card: OperatorCard, tensor: TensorSpec) -> int:
    """A convolution's sums: over cg input channels of a kh x kw window (kh is 1 for a 1-d one)."""
    sizes = card.sizes
    return sizes.get("cg", 1) * sizes.get("kh", 1) * sizes.get("kw", 1)


SCORES_LOSE_ULPS = (
    "large q makes large scores, and an fp32 score of 1e5 is off by its last bits, enough to move the softmax's "
    "weights beyond the card's tolerance: no honest fp32 kernel agrees with the float64 reference there"
)
NOT_SCORES = "the softmax's -inf masks are not q's values: an attention mask is not carded"

FAMILIES: dict[str, Family] = {
    "softmax": Family(
        applies={
            "large-logits": "exp(x) overflows above 88.7 and underflows below -87 in fp32: a kernel without the "
            "max subtraction gives NaN; with it the output is exact. bf16 holds +-1e4 but rounds it to "
            "multiples of 64, so such rows are ties",
            "masked": "exp(-inf) = 0 is how attention masks a logit; an online softmax that rescales by "
            "exp(m_old - m_new) with both -inf gets NaN",
            "fully-masked": "padding rows: the reference, like torch.softmax, gives NaN (exp(-inf - -inf)); a "
            "card whose kernel writes 0 there skips this set with that reason",
            "equal-rows": "ties: every entry is the max, the output exactly 1/cols",
            "max-finite": "defined there: x - max is 0 or -inf; exp(max) is inf",
            "tiny": "exp(x) = 1 for all of them, the output 1/cols: flushing subnormals must not matter",
            "nan-inf": "a NaN or +inf makes the row NaN (inf - inf), as torch gives; -inf alone is a mask",
        },
        skips={
            "large": "shift-invariant and saturating: large-logits covers magnitude",
            "zero-rows": "a zero row is one of the equal-rows",
            "large-mean": "shift-invariant: a row's mean cancels exactly in x - max (large-logits)",
            "outliers": "one large logit is the max: large-logits and max-finite cover it",
        },
        arithmetic="dtype",
    ),
    "rms_norm": Family(
        applies={
            "large": NORM["large"],
            "zero-rows": "eps decides: y = 0; without eps 0 * rsqrt(0) = NaN",
            "tiny": "mean(x^2) underflows in fp32 or sits near eps: eps decides, and a kernel with another eps "
            "or none fails",
            "nan-inf": "NaN makes the row NaN; +-inf makes mean(x^2) inf, so y = 0 with NaN at the inf "
            "(inf * 0), as torch gives",
        },
        skips={
            "large-logits": "not a softmax: large covers magnitude",
            "masked": NOT_SOFTMAX,
            "fully-masked": NOT_SOFTMAX,
            "equal-rows": "no centring: a constant row is an ordinary row (zero-rows is where eps decides)",
            "large-mean": "no centring: nothing cancels",
            "outliers": "no centring: one large entry only adds to mean(x^2) (large covers magnitude)",
            "max-finite": NO_MAX_FINITE.format(what="sum of squares"),
        },
        arithmetic="squares",
    ),
    "layer_norm": Family(applies=NORM, skips=NORM_SKIPS, arithmetic="squares", constant_largest=SCALED_CONSTANT),
    "group_norm": Family(
        applies=NORM, skips=NORM_SKIPS, arithmetic="squares", row=_per_group, constant_largest=SCALED_CONSTANT
    ),
    "pooling": Family(applies=SUMS, skips=SUMS_SKIPS, arithmetic="sums", row=_per_output),
    "stencil": Family(applies=SUMS, skips=SUMS_SKIPS, arithmetic="sums"),
    "elementwise": Family(
        applies={
            "large": "exp-based activations overflow far inside the dtype's range (silu, tanh written with "
            "exp); the reference says what the operator gives there",
            "max-finite": "defined on the largest values: a + b overflows to inf as fp32 arithmetic does",
            "tiny": "subnormal inputs and outputs: flushing them to zero is within atol",
            "nan-inf": "NaN and +-inf propagate element by element as IEEE arithmetic says (inf - inf = NaN)",
        },
        skips={
            "large-logits": "not a softmax: large covers magnitude",
            "masked": NOT_SOFTMAX,
            "fully-masked": NOT_SOFTMAX,
            "equal-rows": "no rows: every element stands alone",
            "zero-rows": "no rows: every element stands alone",
            "large-mean": "no rows: every element stands alone",
            "outliers": "no rows: every element stands alone",
        },
        arithmetic="dtype",
        row=_element,
        every_input=True,
    ),
    "convolution": Family(
        applies={
            "large": "fp32 sums over the window (cg * kh * kw products) stay exact enough up to 2^-4 * FLT_MAX / "
            "window; half-precision accumulators do not",
            "tiny": "tiny and subnormal products: flushing subnormals to zero is within atol, anything worse is not",
            "nan-inf": "a NaN or +-inf in x reaches every output whose window covers it, and no other (padding "
            "reads zeros, not a neighbour's value)",
        },
        skips=SUMS_SKIPS,
        arithmetic="sums",
        span=_window,
    ),
    "attention": Family(
        applies={
            "tiny": "q near zero or subnormal: the scores are near 0, the output near the mean of v over the keys "
            "a query sees; flushing subnormals must not matter",
            "zero-rows": "a zero query scores every key 0: its output is exactly the mean of v over the keys it sees "
            "(all of them, or the causal prefix)",
        },
        skips={
            "large-logits": SCORES_LOSE_ULPS,
            "large": SCORES_LOSE_ULPS,
            "large-mean": SCORES_LOSE_ULPS,
            "outliers": SCORES_LOSE_ULPS,
            "max-finite": SCORES_LOSE_ULPS,
            "equal-rows": "a constant q row scores keys by c * sum(k): large constants make large scores, and "
            "zero-rows is the constant row that is exact",
            "masked": NOT_SCORES,
            "fully-masked": NOT_SCORES,
            "nan-inf": "an inf in q makes scores of both signs' infinities, which the CPU's and CUDA's flash kernels "
            "treat as masks or NaN differently: the operator does not say what such a row is",
        },
        arithmetic="dtype",
    ),
    **{
        family: Family(applies={}, skips=dict.fromkeys(KINDS, NONE_YET), arithmetic="sums")
        for family in ("matmul", "reduction", "copy", "scan", "sparse", "sort", "spectral", "other")
    },
}


@dataclass(frozen=True)
class Planned:
    """One stress set of a card: what it holds, why its family runs it, and the card's reason if it does not."""

    name: str
    holds: str
    why: str
    skipped: str | None

    @property
    def label(self) -> str:
        """The set's name among the card's input sets, as failures name it."""
        return f"stress:{self.name}"

    def describe(self) -> str:
        return f"{self.label}: " + (f"skipped: {self.skipped}" if self.skipped else self.holds)


def plan(card: OperatorCard) -> list[Planned]:
    """Every stress set of the card's family, in the family's order, skipped ones included."""
    family = FAMILIES[card.family]
    return [Planned(name, KINDS[name].holds, why, card.stress.skip.get(name)) for name, why in family.applies.items()]


def running(card: OperatorCard) -> list[Planned]:
    return [planned for planned in plan(card) if planned.skipped is None]


def data_tensors(card: OperatorCard) -> list[TensorSpec]:
    """The inputs that take the stress values."""
    return list(card.inputs) if FAMILIES[card.family].every_input else [card.inputs[0]]


def check(card: OperatorCard) -> None:
    """The card's [stress] table against its family; a FieldProblem names the field and the fix."""
    family = FAMILIES[card.family]
    for name in card.stress.skip:
        if name not in family.applies:
            why = f": {family.skips[name]}" if name in family.skips else ""
            raise FieldProblem(
                f"stress.skip.{name}",
                f"{name!r} is not a stress set of the {card.family} family{why}",
                f"skip only sets the family runs: {', '.join(family.applies) or 'it runs none'}",
            )
    left = [planned.name for planned in running(card)]
    if left and card.reference.kind != "numpy":
        raise FieldProblem(
            "stress",
            f"stress sets need a NumPy reference, and this card's reference is its {card.reference.kind} kernel "
            "(a baseline can be exactly the kind of kernel they catch, so it cannot say what is right there)",
            f"give a numpy [reference], or skip each set with a reason under [stress.skip]: {', '.join(left)}",
        )
    for tensor in data_tensors(card) if left else []:
        if tensor.dtype not in FLOATING:
            raise FieldProblem(
                "stress",
                f"stress values go into input {tensor.name!r}, which is {tensor.dtype}",
                f"skip each set with a reason under [stress.skip]: {', '.join(left)}",
            )


def limits(card: OperatorCard, tensor: TensorSpec) -> Limits:
    """What one data tensor holds: its dtype's range, bounded by the family's fp32 (fp64 for fp64 data) sums."""
    dtype_max, smallest_normal, smallest_subnormal = float_limits(tensor.dtype)
    accumulator = max(F32_MAX, dtype_max)
    family = FAMILIES[card.family]
    row = (family.span or family.row)(card, tensor)
    arithmetic = family.arithmetic
    bound = {
        "dtype": dtype_max,
        "sums": accumulator / row / 16,
        "squares": math.sqrt(accumulator / row) / 16,
    }[arithmetic]
    atol = card.outputs[0].effective_tolerance().atol
    return Limits(
        largest=min(bound, dtype_max),
        mean_over_spread=min(max(atol * 2**24 / 8, MEAN_GRID / 15), 1024),
        constant_largest=min(bound, dtype_max, FAMILIES[card.family].constant_largest),
        max=dtype_max,
        smallest_normal=smallest_normal,
        smallest_subnormal=smallest_subnormal,
    )


def draw(card: OperatorCard, name: str, base: Arrays) -> Arrays:
    """The inputs of stress set `name`: `base` (the card's own distribution, drawn from the stress seed) with
    the set's values written into the family's data tensors. Reproducible from the seed and the name."""
    kind = KINDS[name]
    rng = np.random.default_rng([card.stress.seed, zlib.crc32(name.encode())])
    arrays = dict(base)
    for tensor in data_tensors(card):
        work = base[tensor.name].astype(np.float64 if tensor.dtype == "float64" else np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are what some sets are made of
            kind.make(work.reshape(-1, FAMILIES[card.family].row(card, tensor)), rng, limits(card, tensor))
            arrays[tensor.name] = np.ascontiguousarray(work.astype(NUMPY[tensor.dtype]))
    return arrays
