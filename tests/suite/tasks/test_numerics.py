"""The numerics tasks (kernelforge_tui/suite/tasks/numerics.py): every reference against an independent computation on
small sizes (scipy.signal, explicit loops, itertools.accumulate, sorted(), an explicit DFT, scipy.integrate.simpson),
the Monte Carlo estimate within its statistical bound of the analytic integral, the tolerances against NumPy
stand-ins of honest fp32 kernels (which pass every set a card runs) and of wrong ones (which fail), and the template
library serving the scan and the stencils (the scan template's seeds and the bf16 stencils built with nvcc)."""

from __future__ import annotations

import asyncio
import cmath
import itertools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy.integrate import simpson
from scipy.signal import correlate, correlate2d

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards.directory import Card, draw_inputs
from kernelforge_tui.cards.dtypes import NUMPY, float_limits
from kernelforge_tui.cards.model import StressSpec
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.convolution import ConvolutionTemplate
from kernelforge_tui.proposers.templates.pooling import PoolingTemplate
from kernelforge_tui.proposers.templates.scan import ScanTemplate
from kernelforge_tui.proposers.templates.stencil import StencilTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import PRECISIONS, Arrays, Precision
from kernelforge_tui.suite.tasks.numerics import MC_INTEGRAL, SORT_SCALES, TASKS, TIES
from kernelforge_tui.suite.vendor_timing import VendorRequest, time_vendor

RNG = np.random.default_rng(29)
F32 = np.float32
Kernel = Callable[[Arrays], np.ndarray]


def _normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def _run(name: str, sizes: dict[str, int], **inputs: np.ndarray) -> Arrays:
    return task(name).reference(inputs, sizes)


# References against independent computations ------------------------------------------------------------------------


@pytest.mark.parametrize("k", [7, 5, 3])
def test_conv_1d_is_scipy_correlate_with_same_padding(k: int) -> None:
    sizes = {"n": 2, "ci": 3, "co": 2, "l": 11, "k": k}
    x, weight = _normal(2, 3, 11), _normal(2, 3, k)
    y = _run("conv_1d", sizes, x=x, weight=weight)["y"]
    expected = [
        [sum(correlate(x[b, c], weight[o, c], mode="same") for c in range(3)) for o in range(2)] for b in range(2)
    ]
    np.testing.assert_allclose(y, np.array(expected), rtol=1e-12, atol=1e-12)


def test_conv_2d_is_an_explicit_loop_and_scipy_correlate2d() -> None:
    sizes = {"n": 2, "ci": 2, "co": 3, "h": 5, "w": 6, "k": 3}
    x, weight = _normal(2, 2, 5, 6), _normal(3, 2, 3, 3)
    y = _run("conv_2d", sizes, x=x, weight=weight)["y"]
    loops = np.zeros((2, 3, 5, 6))
    for b, o, r, q, c, dy, dx in itertools.product(
        range(2), range(3), range(5), range(6), range(2), range(3), range(3)
    ):
        if 0 <= r + dy - 1 < 5 and 0 <= q + dx - 1 < 6:
            loops[b, o, r, q] += weight[o, c, dy, dx] * x[b, c, r + dy - 1, q + dx - 1]
    np.testing.assert_allclose(y, loops, rtol=1e-12, atol=1e-12)
    by_scipy = sum(correlate2d(x[1, c], weight[2, c], mode="same") for c in range(2))
    np.testing.assert_allclose(y[1, 2], by_scipy, rtol=1e-12, atol=1e-12)


def test_max_pooling_2d_is_a_window_loop_that_propagates_nan() -> None:
    sizes = {"n": 1, "c": 2, "h": 4, "w": 6}
    x = _normal(1, 2, 4, 6)
    x[0, 0, 1, 1], x[0, 1, 2, 5], x[0, 1, 0, 0] = np.nan, np.inf, -np.inf
    y = _run("max_pooling_2d", sizes, x=x)["y"]
    for c, r, q in itertools.product(range(2), range(2), range(3)):
        window = [float(x[0, c, 2 * r + i, 2 * q + j]) for i in (0, 1) for j in (0, 1)]
        expected = math.nan if any(math.isnan(v) for v in window) else max(window)
        assert y[0, c, r, q] == expected or (math.isnan(expected) and math.isnan(y[0, c, r, q]))
    assert math.isnan(y[0, 0, 0, 0]) and y[0, 1, 1, 2] == math.inf


def test_stencils_are_explicit_loops_with_a_copied_boundary() -> None:
    u2 = _normal(5, 7)
    v2 = _run("stencil_2d", {"ny": 5, "nx": 7}, u=u2)["v"]
    for y, x in itertools.product(range(5), range(7)):
        inside = 0 < y < 4 and 0 < x < 6
        expected = (u2[y - 1, x] + u2[y + 1, x] + u2[y, x - 1] + u2[y, x + 1]) / 4 if inside else u2[y, x]
        assert v2[y, x] == pytest.approx(expected, rel=1e-14, abs=1e-14)
    u3 = _normal(4, 5, 6)
    v3 = _run("stencil_3d", {"nz": 4, "ny": 5, "nx": 6}, u=u3)["v"]
    for z, y, x in itertools.product(range(4), range(5), range(6)):
        if 0 < z < 3 and 0 < y < 4 and 0 < x < 5:
            offsets = [(-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1)]
            expected = math.fsum(u3[z + dz, y + dy, x + dx] for dz, dy, dx in offsets) / 6
        else:
            expected = u3[z, y, x]
        assert v3[z, y, x] == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_prefix_sum_is_itertools_accumulate() -> None:
    x = _normal(1000)
    y = _run("prefix_sum", {"n": 1000}, x=x)["y"]
    np.testing.assert_allclose(y, list(itertools.accumulate(x.tolist())), rtol=1e-13, atol=1e-12)


def _numbers_then_nan(values: list[float]) -> list[float]:
    return sorted(v for v in values if not math.isnan(v)) + [v for v in values if math.isnan(v)]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_sorting_is_sorted_with_nan_last_on_the_keys_its_cards_draw(precision: Precision) -> None:
    sizes = cards.spec(task("sorting"), precision, 2**12).sizes
    keys = task("sorting").draw(sizes, precision, seed=1)["x"]
    assert keys.dtype == NUMPY[precision] and keys.shape == (2**12,)
    values = keys.astype(np.float64)
    assert len(set(values.tolist())) < 0.9 * values.size, "an eighth of the keys are ties"
    assert np.isin(TIES, values).all() and np.isfinite(values).all()
    assert values.max() == -values.min() == float_limits(precision)[0], "the dtype's extreme finite values"
    assert _run("sorting", sizes, x=keys)["y"].tolist() == sorted(values.tolist())
    with_nan = np.concatenate([values[:50], [np.nan, np.inf, -np.inf, np.nan, -0.0, 0.0]])
    got = _run("sorting", {"n": 56}, x=with_nan)["y"].tolist()
    want = _numbers_then_nan(with_nan.tolist())
    assert got[:-2] == want[:-2] and all(math.isnan(v) for v in got[-2:])


@pytest.mark.parametrize("m", [8, 12, 1])
def test_fft_is_an_explicit_dft(m: int) -> None:
    x = _normal(3, m, 2)
    y = _run("fft", {"batch": 3, "m": m, "logm": 3}, x=x)["y"]
    for r, k in itertools.product(range(3), range(m)):
        bin_ = sum(complex(x[r, j, 0], x[r, j, 1]) * cmath.exp(-2j * math.pi * j * k / m) for j in range(m))
        assert y[r, k, 0] == pytest.approx(bin_.real, abs=1e-12) and y[r, k, 1] == pytest.approx(bin_.imag, abs=1e-12)


def test_monte_carlo_reference_is_the_mean_of_the_integrand() -> None:
    points = RNG.random((100, 4))
    got = _run("monte_carlo_integration", {"n": 100, "d": 4}, points=points)["estimate"]
    expected = math.fsum(math.exp(-math.fsum(c * c for c in p)) for p in points.tolist()) / 100
    assert got.shape == (1,) and got[0] == pytest.approx(expected, rel=1e-14)
    one_axis = math.fsum(math.exp(-(((t + 0.5) / 1e4) ** 2)) for t in range(10_000)) / 1e4  # the midpoint rule
    assert pytest.approx(one_axis**4, rel=1e-8) == MC_INTEGRAL


@pytest.mark.parametrize("precision", PRECISIONS)
def test_monte_carlo_estimates_lie_within_five_standard_errors_of_the_integral(precision: Precision) -> None:
    """The statistical check written in the task: for the cards' fixed seeds, at every scale, the points are what
    they claim (uniform on [0,1]^4), so the deterministic estimate the GPU is held to is a valid estimate."""
    mc = task("monte_carlo_integration")
    for scale, seed in itertools.product(mc.scales, cards.SEEDS):
        spec = cards.spec(mc, precision, scale)
        inputs = draw_inputs(spec, seed)
        p = inputs["points"].astype(np.float64)
        assert p.min() >= 0.0 and p.max() <= 1.0
        f = np.exp(-np.sum(p * p, axis=1))
        estimate = mc.reference(inputs, spec.sizes)["estimate"][0]
        standard_error = f.std(ddof=1) / math.sqrt(f.size)
        assert abs(estimate - MC_INTEGRAL) < 5 * standard_error, (scale, seed)
    assert 5 * standard_error < 1e-3, "at 2^20 points the bound is tight"


def test_simpson_is_scipy_simpson_and_exact_on_cubics() -> None:
    f = _normal(5, 17)
    got = _run("simpson_integration", {"rows": 5, "m": 16}, f=f)["integral"]
    np.testing.assert_allclose(got, [simpson(row, dx=1 / 16) for row in f], rtol=1e-12, atol=1e-14)
    t = np.linspace(0.0, 1.0, 9)
    cubic = np.stack([3 * t**3 - t**2 + 2, -(t**3) + 5 * t])
    np.testing.assert_allclose(
        _run("simpson_integration", {"rows": 2, "m": 8}, f=cubic)["integral"], [3 / 4 - 1 / 3 + 2, -1 / 4 + 5 / 2]
    )


# Tolerances: honest fp32 stand-ins pass every set a card runs, wrong ones fail -------------------------------------


def _failures(card: Card, kernel: Kernel) -> dict[str, int]:
    """Set name -> elements outside the card's tolerance, as the worker would judge the kernel's output."""
    out = card.spec.outputs[0]
    sets = [(which.name, *card.input_set(which)) for which in card.spec.input_sets]
    result = {}
    for name, inputs, refs in [*sets, *card.stress_sets()]:
        with np.errstate(all="ignore"):
            got = kernel(inputs).astype(NUMPY[out.dtype]).reshape(refs[out.name].shape)
        result[name] = int((~out.effective_tolerance().accepts(got, refs[out.name])).sum())
    return result


def _stencil_2d(order: str) -> Kernel:
    """fp32 in the template's order ((n + s) + (w + e)) or the baseline's (((n + s) + w) + e)."""

    def run(inputs: Arrays) -> np.ndarray:
        u = inputs["u"].astype(F32)
        n, s, w, e = u[:-2, 1:-1], u[2:, 1:-1], u[1:-1, :-2], u[1:-1, 2:]
        v = u.copy()
        v[1:-1, 1:-1] = F32(0.25) * ((n + s) + (w + e) if order == "template" else ((n + s) + w) + e)
        return v

    return run


def _stencil_3d(order: str) -> Kernel:
    def run(inputs: Arrays) -> np.ndarray:
        u = inputs["u"].astype(F32)
        c, lo, hi = slice(1, -1), slice(None, -2), slice(2, None)
        below, above, n, s, w, e = u[lo, c, c], u[hi, c, c], u[c, lo, c], u[c, hi, c], u[c, c, lo], u[c, c, hi]
        v = u.copy()
        if order == "template":
            v[c, c, c] = F32(1 / 6) * (((n + s) + (w + e)) + (below + above))
        else:
            v[c, c, c] = (((((below + above) + n) + s) + w) + e) * F32(1 / 6)
        return v

    return run


@pytest.mark.parametrize("precision", PRECISIONS)
def test_honest_fp32_stencils_pass_every_set_and_large_is_skipped_for_a_reason(
    precision: Precision, tmp_path: Path
) -> None:
    """Both summation orders (the template's, the baseline's) pass the seeded sets, tiny and nan-inf; on large, were
    it not skipped, even the template's order fails some points (STENCIL_SKIP says why)."""
    written = {}
    for name, kernel in (("stencil_2d", _stencil_2d), ("stencil_3d", _stencil_3d)):
        written[name] = card = cards.write(task(name), precision, 2**18, tmp_path)
        assert {label for label, _, _ in card.stress_sets()} == {"stress:tiny", "stress:nan-inf"}
        for order in ("template", "baseline"):
            assert set(_failures(card, kernel(order)).values()) == {0}, (name, order)
    two_d = written["stencil_2d"]
    unskipped = two_d.spec.model_copy(update={"stress": StressSpec(seed=cards.STRESS_SEED)})
    failed = _failures(Card(spec=unskipped, root=two_d.root), _stencil_2d("template"))
    assert failed["stress:large"] > 0 and failed["stress:tiny"] == failed["stress:nan-inf"] == 0


def _max_pool(drop_nan: bool) -> Kernel:
    """The baseline's comparisons (a NaN replaces the max and stays), or fmaxf's (NaN dropped)."""

    def run(inputs: Arrays) -> np.ndarray:
        x = inputs["x"].astype(F32)
        n, c, h, w = x.shape
        windows = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
        if drop_nan:
            return np.fmax.reduce(windows, axis=-1)
        m = windows[..., 0]
        for j in (1, 2, 3):
            v = windows[..., j]
            m = np.where((v > m) | np.isnan(v), v, m)
        return m

    return run


@pytest.mark.parametrize("precision", PRECISIONS)
def test_max_pooling_is_exact_on_every_set_and_catches_a_nan_dropping_max(precision: Precision, tmp_path: Path) -> None:
    card = cards.write(task("max_pooling_2d"), precision, 2**14, tmp_path)
    assert set(_failures(card, _max_pool(drop_nan=False)).values()) == {0}
    dropped = _failures(card, _max_pool(drop_nan=True))
    assert dropped["stress:nan-inf"] > 0 and sum(dropped.values()) == dropped["stress:nan-inf"]


def _prefix_sum(accumulator: np.dtype[np.generic] = NUMPY["float32"], dropped: int | None = None) -> Kernel:
    """The baseline's order with sums in `accumulator`: per-thread strided carry sums and a tree, 8 items per thread,
    the threads' totals scanned, then each item added onto carry + the totals before it (`dropped`: one element
    left out)."""

    def run(inputs: Arrays) -> np.ndarray:
        x = inputs["x"].astype(accumulator)
        if dropped is not None:
            x[dropped] = 0
        block, items = 256, 8
        chunks = x.reshape(-1, block * items)
        strided = np.cumsum(x.reshape(-1, block), axis=0, dtype=accumulator)  # row r: each thread's r + 1 elements
        carry = np.zeros((len(chunks), block), accumulator)
        carry[1:] = strided[items * np.arange(1, len(chunks)) - 1]
        while carry.shape[1] > 1:
            carry = carry[:, : carry.shape[1] // 2] + carry[:, carry.shape[1] // 2 :]
        own = chunks.reshape(len(chunks), block, items)
        totals = np.cumsum(own.sum(axis=2, dtype=accumulator), axis=1, dtype=accumulator)
        run = carry + np.concatenate([np.zeros((len(chunks), 1), accumulator), totals[:, :-1]], axis=1)
        y = np.empty_like(own)
        for j in range(items):
            run = run + own[:, :, j]
            y[:, :, j] = run
        return y.reshape(-1)

    return run


@pytest.mark.parametrize("precision", PRECISIONS)
def test_prefix_sum_tolerance_takes_fp32_partial_sums_and_refuses_wrong_ones(
    precision: Precision, tmp_path: Path
) -> None:
    """fp32 partial sums pass; bf16 ones fail either card. A dropped element (|x| ~ 0.8) fails the fp32 card; the
    bf16 card cannot see it where |y| ~ 500 (bf16's step there is 2 to 4)."""
    card = cards.write(task("prefix_sum"), precision, 2**18, tmp_path)
    assert set(_failures(card, _prefix_sum()).values()) == {0}
    assert all(_failures(card, _prefix_sum(accumulator=NUMPY["bfloat16"])).values())
    if precision == "float32":
        assert all(_failures(card, _prefix_sum(dropped=2**17)).values())


def _dft(twiddle: np.dtype[np.generic]) -> Kernel:
    """A sequential fp32 DFT whose twiddles are rounded to `twiddle` (fp32 as the baseline's, or bf16)."""

    def run(inputs: Arrays) -> np.ndarray:
        x = inputs["x"].astype(F32)
        batch, m, _ = x.shape
        k = np.arange(m)
        re, im = np.zeros((batch, m), F32), np.zeros((batch, m), F32)
        for j in range(m):
            angle = -2 * np.pi * (j * k % m) / m
            c, s = (np.cos(angle).astype(twiddle).astype(F32), np.sin(angle).astype(twiddle).astype(F32))
            a, b = x[:, j, :1], x[:, j, 1:]
            re, im = re + (a * c - b * s), im + (a * s + b * c)
        return np.stack([re, im], axis=-1)

    return run


def test_fft_tolerance_takes_a_naive_fp32_dft_and_refuses_bf16_twiddles(tmp_path: Path) -> None:
    card = cards.write(task("fft"), "float32", 2**14, tmp_path)
    assert set(_failures(card, _dft(NUMPY["float32"])).values()) == {0}
    assert all(_failures(card, _dft(NUMPY["bfloat16"])).values())


def _tf32(a: np.ndarray) -> np.ndarray:
    """fp32 values rounded to TF32's 10 mantissa bits (nearest, ties away)."""
    bits = a.astype(F32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(F32)


def _conv_2d(rounding: Callable[[np.ndarray], np.ndarray]) -> Kernel:
    """The baseline's sequential fp32 sum over (c, dy, dx), products of `rounding`'s inputs."""

    def run(inputs: Arrays) -> np.ndarray:
        x, weight = rounding(inputs["x"].astype(F32)), rounding(inputs["weight"].astype(F32))
        n, ci, h, w = x.shape
        padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        y = np.zeros((n, weight.shape[0], h, w), F32)
        for c, dy, dx in itertools.product(range(ci), range(3), range(3)):
            y += weight[None, :, c, dy, dx, None, None] * padded[:, c, None, dy : dy + h, dx : dx + w]
        return y

    return run


def test_conv_tolerance_takes_sequential_fp32_sums_and_refuses_tf32(tmp_path: Path) -> None:
    card = cards.write(task("conv_2d"), "float32", 2**18, tmp_path)
    assert set(_failures(card, _conv_2d(lambda a: a)).values()) == {0}
    tf32 = _failures(card, _conv_2d(_tf32))
    assert tf32["seed_1"] and tf32["seed_2"], "TF32 products miss the normal sets (tiny ones sit inside atol)"


def test_integrations_take_their_baselines_fp32_order(tmp_path: Path) -> None:
    def simpson_rows(inputs: Arrays) -> np.ndarray:
        f = inputs["f"].astype(F32)
        m = f.shape[1] - 1
        s = f[:, 0] + f[:, m]
        for i in range(1, m):
            s = s + F32(4 if i % 2 else 2) * f[:, i]
        return s / F32(3 * m)

    def one_block(inputs: Arrays) -> np.ndarray:
        p = inputs["points"].astype(F32)
        f = np.exp(-((((p[:, 0] * p[:, 0]) + p[:, 1] * p[:, 1]) + p[:, 2] * p[:, 2]) + p[:, 3] * p[:, 3]))
        sums = np.zeros(256, F32)
        for row in f.reshape(-1, 256):
            sums += row
        while sums.size > 1:
            sums = sums[: sums.size // 2] + sums[sums.size // 2 :]
        return sums / F32(p.shape[0])

    for precision in PRECISIONS:
        simpson_card = cards.write(task("simpson_integration"), precision, 2**18, tmp_path)
        assert set(_failures(simpson_card, simpson_rows).values()) == {0}
        mc_card = cards.write(task("monte_carlo_integration"), precision, 2**22, tmp_path)
        assert set(_failures(mc_card, one_block).values()) == {0}


# What each task declares ---------------------------------------------------------------------------------------------


def test_declarations_name_their_limits() -> None:
    assert [t.name for t in TASKS] == [
        "conv_1d", "conv_2d", "max_pooling_2d", "stencil_2d", "stencil_3d", "prefix_sum", "sorting", "fft",
        "monte_carlo_integration", "simpson_integration",
    ]  # fmt: skip
    assert task("sorting").scales == SORT_SCALES and len(SORT_SCALES) >= 4
    assert task("fft").precisions == ("float32",) and "cuFFT has no bf16" in task("fft").no_bf16
    assert "5 standard errors" in task("monte_carlo_integration").check
    vendors = {t.name: t.vendor.library.split()[0] if t.vendor else None for t in TASKS}
    assert vendors == {
        "conv_1d": "cuDNN", "conv_2d": "cuDNN", "max_pooling_2d": "PyTorch", "stencil_2d": None, "stencil_3d": None,
        "prefix_sum": "CUB", "sorting": "CUB", "fft": "cuFFT", "monte_carlo_integration": None,
        "simpson_integration": None,
    }  # fmt: skip
    assert all("No vendor library" in t.description for t in TASKS if t.vendor is None)
    for t in TASKS:
        for precision, scale in itertools.product(t.precisions, t.scales):
            spec = cards.spec(t, precision, scale)
            assert spec.flops() > 0 and spec.name.startswith(t.name)


@pytest.mark.parametrize("name", [t.name for t in TASKS if t.vendor is not None])
def test_the_vendor_agrees_with_the_reference_on_the_cpu(name: str, tmp_path: Path) -> None:
    """torch's CPU kernels stand in for cuDNN, CUB and cuFFT: the vendor call is written right and its outputs meet
    the card's tolerance (on the GPU the bench checks again)."""
    torch = pytest.importorskip("torch")
    for precision in task(name).precisions:
        card = cards.write(task(name), precision, task(name).scales[0], tmp_path)
        reply = time_vendor(VendorRequest(card_dir=card.root, device="cpu"))
        assert (reply.agrees, reply.error) == (True, ""), (precision, reply.check)
    if name.startswith("conv"):
        assert torch.backends.cudnn.allow_tf32 is False, "the fp32 convolution is not run in TF32"


# Templates -----------------------------------------------------------------------------------------------------------


def test_the_scan_stencil_pooling_and_convolution_templates_serve_their_cards_and_the_others_say_why() -> None:
    for name, kind in (
        ("conv_1d", ConvolutionTemplate),
        ("conv_2d", ConvolutionTemplate),
        ("prefix_sum", ScanTemplate),
        ("stencil_2d", StencilTemplate),
        ("stencil_3d", StencilTemplate),
        ("max_pooling_2d", PoolingTemplate),
    ):
        for precision, scale in itertools.product(PRECISIONS, task(name).scales):
            spec = cards.spec(task(name), precision, scale)
            assert isinstance(template_for(spec), kind), spec.name
            assert len(TemplateProposer().seeds(spec)) >= 3, spec.name
    why = {t.name: TemplateProposer().cannot_serve(cards.spec(t, "float32", t.scales[0])) for t in TASKS}
    for name in ("sorting", "fft"):
        assert "has no template for family" in str(why[name]), name


def test_the_scan_template_space() -> None:
    template = ScanTemplate()
    small = cards.spec(task("prefix_sum"), "float32", 2**10)
    large = cards.spec(task("prefix_sum"), "bfloat16", 2**22)
    assert template.valid(small, {"block": 1024, "ipt": 2, "vec": 4, "stage": 0}) is None, "a chunk beyond n"
    assert template.valid(large, {"block": 1024, "ipt": 16, "vec": 8, "stage": 1}) is None, "64 KiB of shared"
    assert template.valid(large, {"block": 1024, "ipt": 16, "vec": 8, "stage": 0}) is not None
    assert template.valid(large, {"block": 128, "ipt": 4, "vec": 8, "stage": 0}) is None, "8192 re-reads of x"
    assert template.valid(large, {"block": 128, "ipt": 8, "vec": 8, "stage": 0}) is not None
    staged = template.valid(large, {"block": 1024, "ipt": 1, "vec": 8, "stage": 1})
    assert staged is not None and not isinstance(staged, str)
    assert staged.as_dict() == {
        "block": 1024, "ipt": 1, "vec": 8, "stage": 0,
    }, "one item per thread: staging changes nothing"  # fmt: skip
    two_d = small.model_copy(update={"inputs": [small.inputs[0].model_copy(update={"shape": ["n", 2]})]})
    assert "n elements" in str(template.unsupported(two_d))


def test_scan_seeds_and_bf16_stencils_build_with_nvcc(tmp_path: Path, cubin_cache: Path) -> None:
    """One small card each: the scan's four seeds, and a shared-tile seed of each bf16 stencil (the template's fp32
    forms are built by tests/proposers/templates/test_templates.py)."""
    builder = Builder(arch="sm_90", flags=("-O3",), cache_dir=cubin_cache, work_dir=tmp_path)
    scan = cards.spec(task("prefix_sum"), "float32", 2**14)
    jobs = [(scan, p) for p in TemplateProposer().seeds(scan)]
    assert len(jobs) == 4
    for name in ("stencil_2d", "stencil_3d"):
        spec = cards.spec(task(name), "bfloat16", 2**14)
        jobs.append((spec, next(p for p in TemplateProposer().seeds(spec) if p.params["smem"])))
    for _, proposal in jobs:
        assert not [p for p in check_source(proposal.source, proposal.plan.entry) if p.severity == "error"]

    async def build_all() -> list[str]:
        results = await asyncio.gather(
            *(builder.build(p.source, p.plan.entry, resolve(p.plan, spec).args) for spec, p in jobs)
        )
        return [
            f"{spec.name} {p.params}: {r.log[-1500:]}" for (spec, p), r in zip(jobs, results, strict=True) if not r.ok
        ]

    assert asyncio.run(build_all()) == []
