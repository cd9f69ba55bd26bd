"""Suite tasks of scientific numerics: convolutions, pooling, stencils, scan, sort, FFT and two integrations.

Each baseline is what a student writes first: a thread per output (a block per chunk for the scan, one block for
the Monte Carlo sum), loads straight from global memory, fp32 sums; each reference is NumPy in float64 (exact for
the sort and the max) and shares nothing with the baseline. Three tasks cannot run the plain recipe, and say why in
place: the scan's naive kernel must be single-launch and finish at 2^22 (`PREFIX_SUM`), a naive sort is quadratic
(`SORTING`'s scales stop at 2^18), and an FFT has no bf16 (`FFT`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from kernelforge_tui.cards.dtypes import NUMPY, float_limits
from kernelforge_tui.cards.model import EXACT, Distribution, Tolerance
from kernelforge_tui.suite.task import BASELINES, Arrays, Baseline, Precision, Sizes, Task, Tensor, Vendor

BF16_RTOL = 1.6e-2
"""PyTorch's bf16 rtol (the card default): a bf16 output is one rounding (2^-9) of its fp32 value, and the
reference's own rounding to bf16 can land one bf16 step (2^-8) away."""
NO_VENDOR = "No vendor library has this operation (cuBLAS, cuDNN, cuFFT and CUB do not), so no vendor time."


def _f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def _log2(scale: int) -> int:
    if scale & (scale - 1):
        raise ValueError(f"numerics tasks run at powers of two, not {scale}")
    return scale.bit_length() - 1


def _square(elements: int) -> int:
    """The side of a square of `elements` (an even power of two)."""
    side = 1 << _log2(elements) // 2
    if side * side != elements:
        raise ValueError(f"{elements} is not a square of a power of two")
    return side


def _sums(atol: float) -> dict[Precision, Tolerance]:
    """Outputs that are fp32 sums: atol absorbs the fp32 rounding where terms cancel (an output near zero has no
    relative scale), rtol the final rounding (fp32: 2^-24; bf16: PyTorch's). bf16 keeps at least its default atol."""
    return {
        "float32": Tolerance(rtol=1e-5, atol=atol),
        "bfloat16": Tolerance(rtol=BF16_RTOL, atol=max(atol, 1e-5)),
    }


def _cudnn(conv: str) -> Vendor:
    """torch.nn.functional's `conv` (cuDNN) with the card's padding. cuDNN computes fp32 convolutions in TF32 unless
    told not to (torch allows it by default): a precision our fp32 tolerance rejects, so TF32 is turned off and the
    vendor runs at the precision the card demands of our kernels."""

    def run(torch: Any, t: Mapping[str, Any], sizes: Sizes) -> Mapping[str, Any]:
        torch.backends.cudnn.allow_tf32 = False
        return {"y": getattr(torch.nn.functional, conv)(t["x"], t["weight"], padding=sizes["k"] // 2)}

    return Vendor(f"cuDNN (torch.nn.functional.{conv}, TF32 off)", run)


CONV_ATOL = 1e-4
"""Convolution outputs are fp32 sums of ci * k (* k) = 56 or 72 products of normal(0,1) values: a simulated
sequential fp32 sum of 72 such terms misses float64 by at most 1.7e-5 over 4M outputs, so 1e-4 passes any honest
order with room, while TF32 products (2^-11 each: ~2.5e-3 over 72 terms) fail."""


CONV_SKIP = {
    "large": (
        "rows of x (a channel of a signal or an image row) are scaled independently (10 up to ~1e36), and a window's "
        "products, over ci channels, cancel at random: the exact answer then needs more than fp32's 24 bits. The "
        "baseline's own sequential fp32 sum misses the float64 value by more than rtol * |y| at 22 of the 16384 "
        "outputs of conv_1d at 2^14 (as does any honest order), and no elementwise tolerance expresses an error "
        "relative to the terms; tiny and nan-inf run"
    )
}


# --- convolutions -----------------------------------------------------------------------------------------------


def _conv_1d(inputs: Arrays, sizes: Sizes) -> Arrays:
    """Cross-correlation as torch.conv1d computes it, padded with k // 2 zeros each side: one matrix product of the
    weights' tap t with the input shifted by t, summed over the taps."""
    x, weight = _f64(inputs["x"]), _f64(inputs["weight"])
    k, length, pad = sizes["k"], sizes["l"], sizes["k"] // 2
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad)))
    y = np.zeros((sizes["n"], sizes["co"], length))
    for t in range(k):
        y += weight[:, :, t] @ padded[:, :, t : t + length]
    return {"y": y}


CONV_1D = Task(
    name="conv_1d",
    family="convolution",
    summary="y = conv1d(x, weight): n x ci x l signals, co x ci x k taps (k = 7), same length, stride 1",
    sizes=lambda scale: {"n": 4, "ci": 8, "co": 8, "l": scale // 32, "k": 7},
    inputs=(Tensor("x", ("n", "ci", "l")), Tensor("weight", ("co", "ci", "k"))),
    outputs=(Tensor("y", ("n", "co", "l")),),
    flops="2 * n * co * l * ci * k",
    baseline=Baseline(
        source=BASELINES.render("conv_1d.cu"),
        entry="conv_1d_naive",
        grid=("cdiv(n * co * l, 256)",),
        block=(256,),
        args=("x", "weight", "y", "n", "ci", "co", "l", "k"),
    ),
    reference=_conv_1d,
    check=(
        "the tolerance of fp32 sums of ci * k = 56 products (atol 1e-4: CONV_ATOL), bf16 adding its output rounding; "
        "the reference is NumPy's float64 matrix products tap by tap, tested against scipy.signal.correlate"
    ),
    tolerance=_sums(CONV_ATOL),
    vendor=_cudnn("conv1d"),
    stress_skip=CONV_SKIP,
    description="A batch of 4 signals of 8 channels, l = scale / 32 samples each; 8 output channels.",
)


def _nchw(scale: int) -> Sizes:
    """n = 2 images of c = 8 channels, square planes: n * c * h * w = scale."""
    side = _square(scale // 16)
    return {"n": 2, "c": 8, "h": side, "w": side}


def _conv_2d(inputs: Arrays, sizes: Sizes) -> Arrays:
    """torch.conv2d's cross-correlation with k // 2 zeros of padding: tap (dy, dx) of the weights times the input
    shifted by (dy, dx), as matrix products over the channels, summed over the taps."""
    x, weight = _f64(inputs["x"]), _f64(inputs["weight"])
    n, h, w, k, pad = sizes["n"], sizes["h"], sizes["w"], sizes["k"], sizes["k"] // 2
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((n, sizes["co"], h * w))
    for dy in range(k):
        for dx in range(k):
            window = padded[:, :, dy : dy + h, dx : dx + w].reshape(n, sizes["ci"], h * w)
            y += weight[:, :, dy, dx] @ window
    return {"y": y.reshape(n, sizes["co"], h, w)}


CONV_2D = Task(
    name="conv_2d",
    family="convolution",
    summary="y = conv2d(x, weight): NCHW, n x ci x h x w images, co x ci x 3 x 3 filters, same size, stride 1",
    sizes=lambda scale: {"n": 2, "ci": 8, "co": 8, "h": _nchw(scale)["h"], "w": _nchw(scale)["w"], "k": 3},
    inputs=(Tensor("x", ("n", "ci", "h", "w")), Tensor("weight", ("co", "ci", "k", "k"))),
    outputs=(Tensor("y", ("n", "co", "h", "w")),),
    flops="2 * n * co * h * w * ci * k * k",
    baseline=Baseline(
        source=BASELINES.render("conv_2d.cu"),
        entry="conv_2d_naive",
        grid=("cdiv(n * co * h * w, 256)",),
        block=(256,),
        args=("x", "weight", "y", "n", "ci", "co", "h", "w", "k"),
    ),
    reference=_conv_2d,
    check=(
        "the tolerance of fp32 sums of ci * k * k = 72 products (atol 1e-4: CONV_ATOL), bf16 adding its output "
        "rounding; the reference is NumPy's float64 matrix products tap by tap, tested against explicit loops"
    ),
    tolerance=_sums(CONV_ATOL),
    vendor=_cudnn("conv2d"),
    stress_skip=CONV_SKIP,
    description="2 images of 8 channels, square planes (8x8 up to 512x512); 8 output channels, 3x3 filters.",
)


# --- pooling ----------------------------------------------------------------------------------------------------


def _max_pool(inputs: Arrays, sizes: Sizes) -> Arrays:
    """The max of each 2x2 window; np.max propagates NaN as torch.max_pool2d does."""
    n, c, h, w = sizes["n"], sizes["c"], sizes["h"], sizes["w"]
    windows = _f64(inputs["x"]).reshape(n, c, h // 2, 2, w // 2, 2)
    return {"y": windows.max(axis=(3, 5))}


MAX_POOLING_2D = Task(
    name="max_pooling_2d",
    family="pooling",
    summary="y = max_pool2d(x, 2): NCHW, 2x2 windows, stride 2, NaN propagating",
    sizes=_nchw,
    inputs=(Tensor("x", ("n", "c", "h", "w")),),
    outputs=(Tensor("y", ("n", "c", "h / 2", "w / 2")),),
    flops="3 * n * c * (h / 2) * (w / 2)",  # three comparisons per window
    baseline=Baseline(
        source=BASELINES.render("max_pooling_2d.cu"),
        entry="max_pooling_2d_naive",
        grid=("cdiv(n * c * (h / 2) * (w / 2), 256)",),
        block=(256,),
        args=("x", "y", "n", "c", "h", "w"),
    ),
    reference=_max_pool,
    check=(
        "exact (the max is one of the inputs), up to subnormals flushed to zero (atol: the smallest normal, as the "
        "pooling family's tiny set allows); NaN in a window gives NaN, as torch.max_pool2d does, on the family's "
        "nan-inf stress set too"
    ),
    tolerance={
        "float32": Tolerance(rtol=1e-30, atol=2.0**-126),
        "bfloat16": Tolerance(rtol=1e-30, atol=2.0**-126),  # bf16 has fp32's exponent range
    },
    vendor=Vendor(
        "PyTorch (torch.nn.functional.max_pool2d)",
        lambda torch, t, sizes: {"y": torch.nn.functional.max_pool2d(t["x"], 2)},
    ),
    description=(
        "2 images of 8 channels, square planes (8x8 up to 512x512). The pooling template serves it (its max pooling "
        "mode: 2x2 windows, stride 2, NaN kept as here)."
    ),
)


# --- stencils ---------------------------------------------------------------------------------------------------

STENCIL_SKIP = {
    "large": (
        "rows are scaled independently (10 up to ~1e33), so a point's neighbours, from three rows, differ by orders "
        "of magnitude and cancel at random: the exact answer then needs more than fp32's 24 bits. Honest fp32 "
        "kernels summing in any order miss the accurate value by more than rtol * |v| at 3e-5 to 2e-4 of the "
        "points of a 2048x2048 grid (simulated on the CPU), and no elementwise tolerance expresses an error "
        "relative to the terms; tiny and nan-inf run"
    )
}
STENCIL_CHECK = (
    "the tolerance of one fp32 sum of {terms} neighbours (atol {atol:g}: the sum's roundings, up to 2^-24 of its "
    "largest partial sum, where the neighbours cancel; rtol as the dtype's default) against a float64 reference; "
    "boundary points are copies and must match exactly within it. Stress sets tiny and nan-inf (IEEE: +inf and -inf "
    "neighbours give NaN, as float64 does); large is skipped (STENCIL_SKIP)"
)
STENCIL_2D_ATOL = 1e-6
"""3 fp32 additions of 4 normal(0,1) neighbours (|u| < 5.5 over 4M points) round by at most ~3 * 2^-24 * 11 = 2e-6
before the factor 1/4: 1e-6 after it; a simulated 2048x2048 grid in three summation orders passes with it and fails
~1000 points with the default atol 1e-8."""
STENCIL_3D_ATOL = 2e-6
"""5 fp32 additions of 6 neighbours, then the factor 1/6: as for 2-D, with two more roundings."""


def _stencil_2d(inputs: Arrays, sizes: Sizes) -> Arrays:
    u = _f64(inputs["u"])
    v = u.copy()
    v[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
    return {"v": v}


STENCIL_2D = Task(
    name="stencil_2d",
    family="stencil",
    summary="one 5-point Jacobi step on a ny x nx grid: v = mean of the 4 neighbours inside, v = u on the boundary",
    sizes=lambda scale: {"ny": _square(scale), "nx": _square(scale)},
    inputs=(Tensor("u", ("ny", "nx")),),
    outputs=(Tensor("v", ("ny", "nx")),),
    flops="4 * ny * nx",  # three additions and a multiply per point
    baseline=Baseline(
        source=BASELINES.render("stencil_2d.cu"),
        entry="stencil_2d_naive",
        grid=("cdiv(nx, 32)", "cdiv(ny, 8)"),
        block=(32, 8),
        args=("u", "v", "ny", "nx"),
    ),
    reference=_stencil_2d,
    check=STENCIL_CHECK.format(terms=4, atol=STENCIL_2D_ATOL),
    tolerance=_sums(STENCIL_2D_ATOL),
    stress_skip=STENCIL_SKIP,
    description=(
        "A square grid (32x32 up to 2048x2048), named as the stencil template expects (u [ny, nx] -> v), which "
        "serves both precisions. " + NO_VENDOR
    ),
)


def _cube(scale: int) -> Sizes:
    """nz <= ny <= nx, powers of two within a factor 2 of each other: nz * ny * nx = scale."""
    bits = _log2(scale)
    z = bits // 3
    y = (bits - z) // 2
    return {"nz": 1 << z, "ny": 1 << y, "nx": 1 << (bits - z - y)}


def _stencil_3d(inputs: Arrays, sizes: Sizes) -> Arrays:
    u = _f64(inputs["u"])
    v = u.copy()
    c, lo, hi = slice(1, -1), slice(None, -2), slice(2, None)
    v[c, c, c] = (u[lo, c, c] + u[hi, c, c] + u[c, lo, c] + u[c, hi, c] + u[c, c, lo] + u[c, c, hi]) / 6.0
    return {"v": v}


STENCIL_3D = Task(
    name="stencil_3d",
    family="stencil",
    summary="one 7-point Jacobi step on an nz x ny x nx grid: v = mean of the 6 neighbours inside, u on the boundary",
    sizes=_cube,
    inputs=(Tensor("u", ("nz", "ny", "nx")),),
    outputs=(Tensor("v", ("nz", "ny", "nx")),),
    flops="6 * nz * ny * nx",  # five additions and a multiply per point
    baseline=Baseline(
        source=BASELINES.render("stencil_3d.cu"),
        entry="stencil_3d_naive",
        grid=("cdiv(nx, 32)", "cdiv(ny, 8)", "nz"),
        block=(32, 8),
        args=("u", "v", "nz", "ny", "nx"),
    ),
    reference=_stencil_3d,
    check=STENCIL_CHECK.format(terms=6, atol=STENCIL_3D_ATOL),
    tolerance=_sums(STENCIL_3D_ATOL),
    stress_skip=STENCIL_SKIP,
    description=(
        "A near-cubic grid (8x8x16 up to 128x128x256), named as the stencil template's 3-D form expects "
        "(u [nz, ny, nx] -> v), which serves both precisions. " + NO_VENDOR
    ),
)


# --- scan and sort ----------------------------------------------------------------------------------------------

SCAN_ATOL = 0.02
"""Inclusive sums of up to 2^22 normal(0,1) values wander to |y| ~ 4700; an fp32 scan rounds every partial sum.
Simulated on the CPU: this baseline's order misses float64 by at most 0.0042, chained scans over tiles of 256 to
16384 by at most 0.0046 (rtol 1e-5 covers the output's own rounding, 2^-24 * |y|). 0.02 leaves 4x for other
parallel orders, and a dropped or doubled element (|x| ~ 0.8) fails. A fully serial fp32 scan (0.16) does not pass:
no GPU kernel sums 4M elements on one thread."""


PREFIX_SUM = Task(
    name="prefix_sum",
    family="scan",
    summary="y[i] = x[0] + ... + x[i] (inclusive scan) over n elements, fp32 accumulation",
    sizes=lambda scale: {"n": scale},
    inputs=(Tensor("x", ("n",)),),
    outputs=(Tensor("y", ("n",)),),
    flops="n",
    baseline=Baseline(
        source=BASELINES.render("prefix_sum.cu"),
        entry="prefix_sum_naive",
        grid=("cdiv(n, 2048)",),  # CHUNK = BLOCK * ITEMS = 2048
        block=(256,),
        args=("x", "y", "n"),
    ),
    reference=lambda inputs, sizes: {"y": np.cumsum(_f64(inputs["x"]))},
    check=(
        "a float64 cumulative sum; atol 0.02 (SCAN_ATOL: fp32 partial sums of up to 2^22 terms, measured) with the "
        "dtype's rtol (bf16: its output rounding, 2^-9 of |y|)"
    ),
    tolerance=_sums(SCAN_ATOL),
    vendor=Vendor(  # fp32 sums, as the card demands of our kernels, rounded once to the card's dtype
        "CUB (torch.cumsum)",
        lambda torch, t, sizes: {"y": torch.cumsum(t["x"], dim=0, dtype=torch.float32).to(t["x"].dtype)},
    ),
    description=(
        "n normal(0,1) values, so the sums wander (a random walk) instead of growing: an absolute error is "
        "meaningful everywhere. The scan template (kernelforge_tui/proposers/templates/scan.py) serves it."
    ),
)

SORT_SCALES = (2**10, 2**12, 2**14, 2**16, 2**18)
"""The naive sort is a rank sort, O(n^2): each of n threads compares its key with all n (a warp reads the same key
at once: one broadcast load). On an H200 that is ~1 ms at 2^16 and ~20 ms at 2^18, but ~0.3 s at 2^20 and ~5 s at
2^22, beyond what a baseline may take; a single-launch sort that is not quadratic needs a merge across blocks, and
blocks cannot wait for each other in one launch. So the scales stop at 2^18: five scales within 2^10..2^22."""
TIES = (0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1000.0)
"""Values an eighth of the keys repeat: a sort must give equal keys distinct slots (+0 and -0 compare equal)."""


def _sort_keys(rng: np.random.Generator, sizes: Sizes, precision: Precision) -> Arrays:
    """Keys that test what a sort must get right: normal values, ties (an eighth drawn from `TIES`; bf16 adds its
    own, since it has 65536 values), and n/1024 (at least one) each of the dtype's largest and most negative finite
    values at random places (a radix sort's sign and exponent bits). No NaN or inf: a suite card's seeded sets have
    finite outputs, and the sort family has no stress sets (where a nan-inf set would go)."""
    n = sizes["n"]
    keys = rng.standard_normal(n)
    tied = rng.random(n) < 1 / 8
    keys[tied] = rng.choice(np.array(TIES), int(tied.sum()))
    count = max(1, n // 1024)
    largest = float_limits(precision)[0]
    keys[rng.permutation(n)[: 2 * count]] = np.repeat([largest, -largest], count)
    return {"x": keys.astype(NUMPY[precision])}


SORTING = Task(
    name="sorting",
    family="sort",
    summary="y = the n keys of x in ascending order, NaN last (as numpy.sort and torch.sort)",
    sizes=lambda scale: {"n": scale, "logn": _log2(scale)},
    inputs=(Tensor("x", ("n",)),),
    outputs=(Tensor("y", ("n",)),),
    flops="n * logn",  # comparisons of an n log n sort
    baseline=Baseline(
        source=BASELINES.render("sorting.cu"),
        entry="sorting_naive",
        grid=("cdiv(n, 256)",),
        block=(256,),
        args=("x", "y", "n"),
    ),
    reference=lambda inputs, sizes: {"y": np.sort(_f64(inputs["x"]))},
    check=(
        "exact: the output is the input's values in order (numpy.sort), compared value by value; equal keys are "
        "interchangeable in a values-only output (+0 and -0 too). The keys hold ties and the dtype's extreme "
        "finite values (a generator draws every set). NaN sorts last in the baseline and the reference (as numpy "
        "and torch; tested on the CPU), but no set holds NaN yet: seeded sets have finite outputs and the sort "
        "family has no stress sets"
    ),
    generate=_sort_keys,
    tolerance={"float32": EXACT, "bfloat16": EXACT},
    scales=SORT_SCALES,
    vendor=Vendor("CUB (torch.sort)", lambda torch, t, sizes: {"y": torch.sort(t["x"]).values}),
    description="Scales 2^10 to 2^18 keys only (SORT_SCALES: a naive sort is quadratic).",
)


# --- spectral ---------------------------------------------------------------------------------------------------

FFT_ATOL = 1e-3
"""Each output is a sum of m = 1024 complex products of normal(0,1) values (|X| up to ~150). A simulated
sequential fp32 DFT (exact twiddles rounded to fp32) misses float64 by at most 1.7e-4 over 131k outputs, about
3 * 2^-24 * m; an fp32 FFT (log2 m = 10 stages) by 7.5e-6. 1e-3 = 16 * 2^-24 * m leaves room for the largest of 8M
outputs; bf16 or TF32 twiddles (2^-9, 2^-11 relative) fail."""


def _fft(inputs: Arrays, sizes: Sizes) -> Arrays:
    x = _f64(inputs["x"])
    spectrum = np.fft.fft(x[..., 0] + 1j * x[..., 1], axis=-1)
    return {"y": np.stack([spectrum.real, spectrum.imag], axis=-1)}


FFT = Task(
    name="fft",
    family="spectral",
    summary="y = fft(x) along rows: batch rows of m = 1024 complex values, interleaved (re, im) float32",
    sizes=lambda scale: {"batch": scale // 1024, "m": 1024, "logm": 10},
    inputs=(Tensor("x", ("batch", "m", 2)),),
    outputs=(Tensor("y", ("batch", "m", 2)),),
    flops="5 * batch * m * logm",  # the usual FFT count, 5 m log2 m per transform
    baseline=Baseline(
        source=BASELINES.render("fft.cu"),
        entry="fft_naive",
        grid=("cdiv(batch * m, 256)",),
        block=(256,),
        args=("x", "y", "batch", "m"),
    ),
    reference=_fft,
    check=(
        "numpy.fft.fft in float64 (tested against an explicit DFT), real and imaginary parts each within atol 1e-3 "
        "(FFT_ATOL: fp32 sums over a row of 1024, scaled with the row length) and rtol 1e-5"
    ),
    tolerance={"float32": Tolerance(rtol=1e-5, atol=FFT_ATOL)},
    precisions=("float32",),
    no_bf16=(
        "cuFFT has no bf16 transforms (torch.fft refuses bfloat16), and a length-1024 spectrum spans ~30x its input's "
        "magnitude: bf16's 8 bits would bury the small bins in the rounding of the large ones"
    ),
    vendor=Vendor(
        "cuFFT (torch.fft.fft)",
        lambda torch, t, sizes: {"y": torch.view_as_real(torch.fft.fft(torch.view_as_complex(t["x"]), dim=-1))},
    ),
    description="scale = complex values: batch = scale / 1024 rows of 1024 (1 to 4096 rows).",
)


# --- integration ------------------------------------------------------------------------------------------------

MC_DIMENSIONS = 4
MC_INTEGRAL = (math.sqrt(math.pi) / 2 * math.erf(1.0)) ** MC_DIMENSIONS
"""The integral of exp(-|p|^2) over [0,1]^4: the product of four one-dimensional integrals of exp(-t^2)."""


def _integrand(inputs: Arrays) -> np.ndarray:
    """f(p) = exp(-|p|^2) at each sample point, in float64."""
    p = _f64(inputs["points"])
    values: np.ndarray = np.exp(-np.sum(p * p, axis=1))
    return values


MONTE_CARLO_INTEGRATION = Task(
    name="monte_carlo_integration",
    family="reduction",
    summary="estimate = mean of f(p) = exp(-|p|^2) over n sample points p, uniform on [0,1]^4",
    sizes=lambda scale: {"n": scale // MC_DIMENSIONS, "d": MC_DIMENSIONS},
    inputs=(Tensor("points", ("n", "d"), distribution=Distribution(kind="uniform", low=0.0, high=1.0)),),
    outputs=(Tensor("estimate", (1,)),),
    flops="n * (2 * d + 2)",  # a square and an add per coordinate, the exp, the sum
    baseline=Baseline(
        source=BASELINES.render("monte_carlo_integration.cu"),
        entry="monte_carlo_integration_naive",
        grid=(1,),
        block=(256,),
        args=("points", "estimate", "n", "d"),
    ),
    reference=lambda inputs, sizes: {"estimate": np.array([_integrand(inputs).mean()])},
    check=(
        "two checks. Deterministic, on the GPU: given the points (drawn uniform on [0,1]^4 from each set's seed), "
        "the estimate is the float64 mean of f over them, within rtol 1e-4 (fp32; an fp32 sum of up to 2^20 "
        "positive terms, ~2^-24 * sqrt(run length) relative for runs of a few thousand; a precision downgrade "
        "fails) or bf16's rtol. Statistical, in tests/suite/tasks/test_numerics.py: for the cards' fixed seeds at "
        "every scale and precision, that mean lies within 5 standard errors (std of f / sqrt(n)) of the analytic "
        "integral ((sqrt(pi) / 2 * erf(1))^4 = 0.3111), so the points are what they claim to be"
    ),
    tolerance={"float32": Tolerance(rtol=1e-4, atol=1e-8), "bfloat16": Tolerance(rtol=BF16_RTOL, atol=1e-5)},
    description=(
        "n = scale / 4 points (256 to 2^20) as an [n, 4] tensor; a single output. " + NO_VENDOR + " (A torch "
        "expression would be elementwise kernels and a reduction, not a library routine.)"
    ),
)

SIMPSON_INTERVALS = 256
SIMPSON_ATOL = 1e-6
"""An integral here is an fp32 sum of 257 weighted samples (weights up to 4, samples normal(0,1)), times 1/768;
the integrals are ~N(0, 0.066^2), so some lie near zero where only atol applies. Sequential fp32 rounding of
partial sums up to ~50 (before the 1/768) is ~1e-7 after it; 1e-6 leaves room for any order."""


def _simpson(inputs: Arrays, sizes: Sizes) -> Arrays:
    """Composite Simpson weights 1, 4, 2, 4, ..., 2, 4, 1 times h / 3, with h = 1 / m, as one matrix product."""
    m = sizes["m"]
    weights = np.where(np.arange(m + 1) % 2 == 1, 4.0, 2.0)
    weights[0] = weights[m] = 1.0
    return {"integral": _f64(inputs["f"]) @ weights / (3.0 * m)}


SIMPSON_INTEGRATION = Task(
    name="simpson_integration",
    family="reduction",
    summary="integral[r] = composite Simpson's rule over [0, 1] of row r's m + 1 equally spaced samples (m = 256)",
    sizes=lambda scale: {"rows": scale // SIMPSON_INTERVALS, "m": SIMPSON_INTERVALS},
    inputs=(Tensor("f", ("rows", "m + 1")),),
    outputs=(Tensor("integral", ("rows",)),),
    flops="rows * (2 * m + 3)",  # a multiply-add per sample, the final scale
    baseline=Baseline(
        source=BASELINES.render("simpson_integration.cu"),
        entry="simpson_integration_naive",
        grid=("cdiv(rows, 256)",),
        block=(256,),
        args=("f", "integral", "rows", "m"),
    ),
    reference=_simpson,
    check=(
        "a float64 weighted sum (tested against scipy.integrate.simpson), within atol 1e-6 (SIMPSON_ATOL: fp32 "
        "sums of 257 weighted samples; integrals near zero have no relative scale) and the dtype's rtol"
    ),
    tolerance=_sums(SIMPSON_ATOL),
    description=(
        "rows = scale / 256 independent integrals (4 to 16384), each of 257 normal(0,1) samples. " + NO_VENDOR
    ),
)


TASKS: tuple[Task, ...] = (
    CONV_1D,
    CONV_2D,
    MAX_POOLING_2D,
    STENCIL_2D,
    STENCIL_3D,
    PREFIX_SUM,
    SORTING,
    FFT,
    MONTE_CARLO_INTEGRATION,
    SIMPSON_INTEGRATION,
)
