"""Stress sets on the CPU: each generator makes what it says, the NumPy references give the honest answer on
it, and known-unsafe rewrites (NumPy stand-ins for the kernels, in the card dtype's fp32 arithmetic, summed as
a GPU block sums) fail the named stress set under the card's tolerance while honest variants pass every set.
tests/gpu/test_stress.py shows the same with real kernels on a GPU."""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards import CardError, load_card, resolve, save_card
from kernelforge_tui.cards.directory import Arrays, Card, draw_inputs, to_toml
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import OperatorCard, OpFamily, Reference, StressSpec, Tolerance
from kernelforge_tui.cards.stress import (
    BLOCKWISE_PATTERNS_FROM,
    FAMILIES,
    KINDS,
    LOGIT_LIMIT,
    _patterns,
    data_tensors,
    draw,
    limits,
    plan,
)
from tests.conftest import EXAMPLES, ROOT
from tests.gpu.test_stress import HONEST as GPU_HONEST
from tests.gpu.test_stress import UNSAFE as GPU_UNSAFE
from tests.gpu.test_stress import Kernel as GpuKernel

CARDS = EXAMPLES / "cards"
F32 = np.float32
Kernel = Callable[[Arrays], np.ndarray]


def small_card(family: str, dtype: str) -> OperatorCard:
    """A card of the family's conventions (the templates'), small and odd-sized."""
    rc, nchw = ["rows", "cols"], ["n", "c", "h", "w"]
    layouts: dict[str, tuple[dict[str, int], list[tuple[str, list[str]]], list[str], str]] = {
        "softmax": ({"rows": 37, "cols": 257}, [("x", rc)], rc, "softmax"),
        "rms_norm": ({"rows": 37, "cols": 257}, [("x", rc), ("w", ["cols"])], rc, "rms_norm"),
        "layer_norm": ({"rows": 37, "cols": 257}, [("x", rc), ("w", ["cols"]), ("b", ["cols"])], rc, "layer_norm"),
        "group_norm": (
            {"n": 3, "c": 8, "h": 5, "w": 7, "groups": 4},
            [("x", nchw), ("gamma", ["c"]), ("beta", ["c"])],
            nchw,
            "ref.py:group_norm",
        ),
        "pooling": ({"n": 3, "c": 16, "h": 7, "w": 7}, [("x", nchw)], ["n", "c"], "ref.py:avg_pool"),
        "stencil": ({"ny": 33, "nx": 65}, [("u", ["ny", "nx"])], ["ny", "nx"], "ref.py:stencil"),
        "elementwise": ({"n": 4099}, [("a", ["n"]), ("b", ["n"])], ["n"], "vector_add"),
        "convolution": (
            {"n": 2, "c": 6, "h": 5, "w": 7, "o": 4, "cg": 3, "kh": 3, "kw": 3, "oh": 5, "ow": 7, "groups": 2},
            [("x", nchw), ("weight", ["o", "cg", "kh", "kw"])],
            ["n", "o", "oh", "ow"],
            "reference.py:reference",
        ),
        "attention": (
            {"batch": 2, "heads": 3, "sq": 37, "sk": 41, "d": 12, "dv": 12},
            [
                ("q", ["batch", "sq", "heads", "d"]),
                ("k", ["batch", "heads", "sk", "d"]),
                ("v", ["batch", "heads", "sk", "dv"]),
            ],
            ["batch", "heads", "sq", "dv"],
            "reference.py:reference",
        ),
    }
    sizes, inputs, out_shape, function = layouts[family]
    return OperatorCard.model_validate(
        {
            "name": f"{family}_{dtype}",
            "family": family,
            "sizes": sizes,
            "inputs": [{"name": n, "dtype": dtype, "shape": s} for n, s in inputs],
            "outputs": [{"name": "c" if family == "elementwise" else "y", "dtype": dtype, "shape": out_shape}],
            "input_sets": [{"name": "seed_1", "seed": 1}],
            "reference": {"function": function},
            "stress": {"seed": 7},
        }
    )


def rows_of(card: OperatorCard, arrays: Arrays) -> np.ndarray:
    """The first data tensor as float64 rows (the span one statistic covers)."""
    tensor = data_tensors(card)[0]
    return arrays[tensor.name].astype(np.float64).reshape(-1, FAMILIES[card.family].row(card, tensor))


FAMILY_KINDS = [(f, k) for f, fam in FAMILIES.items() for k in fam.applies]
DTYPES = ["float32", "bfloat16", "float16"]


# --- what each family runs, and says ---------------------------------------------------------------


def test_every_family_decides_every_kind_with_a_reason() -> None:
    assert set(FAMILIES) == set(typing.get_args(OpFamily))
    for name, family in FAMILIES.items():
        assert set(family.applies) | set(family.skips) == set(KINDS), name
        assert not set(family.applies) & set(family.skips), name
        assert all(len(why) > 20 for why in [*family.applies.values(), *family.skips.values()]), name
    assert all(len(kind.holds) > 20 for kind in KINDS.values())


def test_the_cards_guide_shows_each_familys_sets() -> None:
    """The cards guide's stress-set table is the family table: it cannot drift from the code."""
    readme = (ROOT / "docs" / "guides" / "cards.md").read_text()
    for name, family in FAMILIES.items():
        row = re.search(rf"^\| `{name}`[^|]*\| ([^|]*) \|", readme, re.MULTILINE)
        assert row is not None, f"docs/guides/cards.md: no row for {name} in the stress-set table"
        assert re.findall(r"`([a-z-]+)`", row.group(1)) == list(family.applies), name


# --- generators ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("family", "kind"), FAMILY_KINDS)
def test_generators_keep_shapes_weights_and_seeds(family: str, kind: str, dtype: str) -> None:
    card = small_card(family, dtype)
    base = draw_inputs(card, card.stress.seed)
    arrays = draw(card, kind, base)
    data = {t.name for t in data_tensors(card)}
    for tensor in card.inputs:
        got = arrays[tensor.name]
        assert got.shape == base[tensor.name].shape and got.dtype == NUMPY[dtype]
        same = got.tobytes() == base[tensor.name].tobytes()
        assert same is (tensor.name not in data), f"{tensor.name}: weights keep the card's own values"
    assert draw(card, kind, base)[card.inputs[0].name].tobytes() == arrays[card.inputs[0].name].tobytes()
    reseeded = card.model_copy(update={"stress": StressSpec(seed=8)})
    assert draw(reseeded, kind, base)[card.inputs[0].name].tobytes() != arrays[card.inputs[0].name].tobytes()


def test_a_convolutions_magnitudes_are_bound_by_its_window_not_its_rows() -> None:
    """Its sums run over cg * kh * kw products (27 here), across the rows of x the values are written by (7 wide)."""
    card = small_card("convolution", "float32")
    assert limits(card, card.inputs[0]).largest == float(np.finfo(F32).max) / 27 / 16


def finite_rows(x: np.ndarray) -> bool:
    return bool(np.isfinite(x).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("family", "kind"), FAMILY_KINDS)
def test_each_generator_makes_what_it_says(family: str, kind: str, dtype: str) -> None:
    card = small_card(family, dtype)
    x = rows_of(card, draw(card, kind, draw_inputs(card, card.stress.seed)))
    info = ml_dtypes.finfo(NUMPY[dtype])
    lim = limits(card, data_tensors(card)[0])
    magnitude = np.abs(x)
    if kind == "large-logits":
        assert finite_rows(x) and magnitude.max() <= LOGIT_LIMIT
        assert x.max() > 88.7 and x.min() < -87.4, "beyond exp's fp32 range both ways"
        assert np.mean(np.abs(x.mean(axis=1)) >= 10) > 0.5, "rows are shifted"
    elif kind in ("masked", "fully-masked"):
        assert not np.isnan(x).any() and not (x == np.inf).any()
        masked = x == -np.inf
        full = masked.all(axis=1)
        assert bool(full.any()) == (kind == "fully-masked")
        rows = masked[~full]
        suffix = (np.diff(rows.astype(int), axis=1) >= 0).all(axis=1) & rows.any(axis=1)
        prefix = (np.diff(rows.astype(int), axis=1) <= 0).all(axis=1) & rows.any(axis=1)
        one_left = (~rows).sum(axis=1) == 1
        scattered = ~(suffix | prefix | one_left)
        assert suffix.any() and prefix.any() and one_left.any() and scattered.any(), "every pattern"
        assert 0.1 < rows[scattered].mean() < 0.99
    elif kind == "equal-rows":
        assert finite_rows(x) and (x == x[:, :1]).all() and (x[:, 0] == 0).any()
        assert len(set(x[:, 0])) >= min(len(x), 10)
    elif kind == "zero-rows":
        zero = (x == 0).all(axis=1)
        assert zero.any() and not zero.all()
    elif kind == "tiny":
        assert finite_rows(x) and magnitude.max() < 0.2
        nonzero = magnitude[magnitude > 0]
        subnormal = nonzero < float(info.smallest_normal)
        assert subnormal.mean() > 0.02, f"{subnormal.mean():.3f} of the values are subnormal in {dtype}"
        mean_square = np.mean(x * x, axis=1)
        assert ((mean_square > 1e-8) & (mean_square < 1e-4)).any(), "rows whose mean(x^2) is near eps"
    elif kind == "large":
        assert finite_rows(x) and magnitude.max() <= lim.largest
        assert magnitude.max() > min(1e6, lim.largest / 100)
    elif kind == "large-mean":
        assert finite_rows(x)
        ratio = np.abs(x.mean(axis=1)) / x.std(axis=1)
        assert (ratio > lim.mean_over_spread / 2).all() and (ratio < lim.mean_over_spread * 2).all()
        unit = np.exp2(np.floor(np.log2(np.abs(x[:, :1]) / 192)))
        assert (np.rint(x / unit) == x / unit).all(), "an integer grid"
        sequential = np.zeros(len(x), F32)
        for column in x.astype(F32).T:
            sequential += column
        assert (sequential.astype(np.float64) == x.sum(axis=1)).all(), "fp32 sums of a row are exact"
    elif kind == "max-finite":
        assert finite_rows(x) and (x == float(info.max)).any() and (x == -float(info.max)).any()
    elif kind == "outliers":
        assert finite_rows(x)
        base = rows_of(card, draw_inputs(card, card.stress.seed))
        moved = x != base
        assert (moved.sum(axis=1) <= 1).all() and moved.any(axis=1).mean() > 0.9, "one entry a row"
        first = moved[:, 0]
        assert 0.3 < first.mean() < 0.7 and moved[:, 1:].any(), "the first entry in half of the rows, others too"
        off = np.abs(x - base.mean(axis=1, keepdims=True))[moved]
        spread = base.std(axis=1)[moved.any(axis=1)]
        assert (off >= np.minimum(500 * np.sqrt(x.shape[1]) * spread, lim.largest / 2)).all()
    elif kind == "nan-inf":
        assert np.isnan(x).any() and (x == np.inf).any() and (x == -np.inf).any()
        assert (~np.isfinite(x)).any(axis=1).mean() < 0.8
    else:
        pytest.fail(f"no check for {kind}")


# --- references ------------------------------------------------------------------------------------


def stress_set(card: Card, name: str) -> tuple[Arrays, Arrays]:
    for label, inputs, outputs in card.stress_sets():
        if label == f"stress:{name}":
            return inputs, outputs
    raise KeyError(name)


@pytest.mark.parametrize("name", ["softmax_f32_small", "softmax_bf16_small"])
def test_softmax_reference_on_stress_sets(name: str) -> None:
    card = load_card(CARDS / name)
    tol = card.spec.outputs[0].effective_tolerance()
    inputs, outputs = stress_set(card, "large-logits")
    x, y = inputs["x"], outputs["y"]
    x64 = x.astype(np.float64)
    log_sum_exp = np.logaddexp.reduce(x64, axis=1, keepdims=True)  # another algorithm, exact enough at 1e4
    assert tol.accepts(y, np.exp(x64 - log_sum_exp).astype(y.dtype)).all(), "exact at +-1e4"
    assert np.allclose(y.astype(np.float64).sum(axis=1), 1.0, rtol=tol.rtol * 10)
    inputs, outputs = stress_set(card, "fully-masked")
    x, y = inputs["x"].astype(np.float64), outputs["y"].astype(np.float64)
    full = (x == -np.inf).all(axis=1)
    assert np.isnan(y[full]).all() and np.isfinite(y[~full]).all()
    assert (y[~full][x[~full] == -np.inf] == 0).all()
    inputs, outputs = stress_set(card, "nan-inf")
    x, y = inputs["x"].astype(np.float64), outputs["y"].astype(np.float64)
    poisoned = (np.isnan(x) | (x == np.inf)).any(axis=1)
    assert np.isnan(y[poisoned]).all() and np.isfinite(y[~poisoned]).all()
    inputs, outputs = stress_set(card, "equal-rows")
    assert tol.accepts(outputs["y"], np.full(outputs["y"].shape, 1 / card.spec.sizes["cols"])).all()


def test_norm_references_on_stress_sets() -> None:
    card = load_card(CARDS / "rms_norm_bf16_small")
    inputs, outputs = stress_set(card, "zero-rows")
    zero = (inputs["x"].astype(np.float64) == 0).all(axis=1)
    assert (outputs["y"].astype(np.float64)[zero] == 0).all()
    inputs, outputs = stress_set(card, "nan-inf")
    x, y = inputs["x"].astype(np.float64), outputs["y"].astype(np.float64)
    infinite = np.isinf(x).any(axis=1) & ~np.isnan(x).any(axis=1)
    assert (np.isnan(y[infinite]) == np.isinf(x[infinite])).all() and (y[infinite][np.isfinite(x[infinite])] == 0).all()
    for name in ("layer_norm_f32_small", "layer_norm_bf16_small"):
        card = load_card(CARDS / name)
        inputs, outputs = stress_set(card, "equal-rows")
        assert (outputs["y"] == np.broadcast_to(inputs["b"], outputs["y"].shape)).all(), "variance 0: y = b"


def test_vector_add_reference_overflows_to_inf() -> None:
    card = Card(spec=small_card("elementwise", "float32"), root=CARDS)
    inputs, outputs = stress_set(card, "max-finite")
    top = float(np.finfo(F32).max)
    both = (inputs["a"] == top) & (inputs["b"] == top)
    assert both.any() and (outputs["c"][both] == np.inf).all()


# --- the comparison rule ---------------------------------------------------------------------------


def test_tolerance_needs_nan_for_nan_and_the_same_infinity() -> None:
    tol = Tolerance(rtol=1e-5, atol=1e-8)
    ref = np.array([np.nan, np.nan, np.inf, np.inf, -np.inf, 1.0, 1.0, 1.0, 0.0], F32)
    out = np.array([np.nan, 0.0, np.inf, -np.inf, -np.inf, 1.000001, 1.001, np.nan, np.inf], F32)
    assert tol.accepts(out, ref).tolist() == [True, False, True, False, True, True, False, False, False]
    bf16 = np.array([np.nan, 3.0], ml_dtypes.bfloat16)
    assert tol.accepts(bf16, bf16).all()


# --- unsafe rewrites fail, honest ones pass (NumPy stand-ins for the GPU tests' kernels) --------------


def block_sum(a: np.ndarray, threads: int = 128, reverse: bool = False) -> np.ndarray:
    """Row sums as a GPU block makes them in fp32: each thread adds its strided elements in order (or in
    reverse), then a tree of pairwise sums over the threads."""
    rows, cols = a.shape
    padded = np.zeros((rows, -(-cols // threads) * threads), F32)
    padded[:, :cols] = a
    chunks = padded.reshape(rows, -1, threads)
    acc = np.zeros((rows, threads), F32)
    for k in range(chunks.shape[1])[::-1] if reverse else range(chunks.shape[1]):
        acc += chunks[:, k]
    while acc.shape[1] > 1:
        acc = acc[:, : acc.shape[1] // 2] + acc[:, acc.shape[1] // 2 :]
    return acc[:, 0]


def fast_exp(x: np.ndarray) -> np.ndarray:
    """__expf: 2^(x * log2(e)), the product rounded to fp32."""
    return np.exp2((x * F32(np.log2(np.e))).astype(F32)).astype(F32)


def softmax_kernel(max_subtraction: bool = True, exp: Callable[[np.ndarray], np.ndarray] = np.exp,
                   threads: int = 128, reverse: bool = False) -> Kernel:  # fmt: skip
    def run(inputs: Arrays) -> np.ndarray:
        x = inputs["x"].astype(F32)
        m = np.fmax.reduce(x, axis=1, keepdims=True) if max_subtraction else F32(0)  # fmaxf skips NaN
        e = exp(x - m)
        return e * (F32(1) / block_sum(e, threads, reverse))[:, None]

    return run


def softmax_online(guard_neg_inf: bool, threads: int = 128) -> Kernel:
    """Each thread keeps a running max and a rescaled sum; unguarded, exp(-inf - -inf) = NaN on a masked prefix."""

    def run(inputs: Arrays) -> np.ndarray:
        x = inputs["x"].astype(F32)
        rows, cols = x.shape
        padded = np.full((rows, -(-cols // threads) * threads), -np.inf, F32)
        padded[:, :cols] = x
        m = np.full((rows, threads), -np.inf, F32)
        s = np.zeros((rows, threads), F32)
        for chunk in padded.reshape(rows, -1, threads).transpose(1, 0, 2):
            grow = chunk > m
            s = np.where(grow, s * np.exp(m - chunk), s)
            m = np.where(grow, chunk, m)
            term = np.exp(chunk - m)
            s += np.where((m == -np.inf) & (chunk == -np.inf), F32(0), term) if guard_neg_inf else term
        top = np.fmax.reduce(m, axis=1, keepdims=True)
        total = np.where(m == -np.inf, F32(0), s * np.exp(m - top)).sum(axis=1, dtype=F32)
        out: np.ndarray = np.exp(x - top) / total[:, None]
        return out

    return run


def softmax_tail_in_max(inputs: Arrays) -> np.ndarray:
    """Takes the max over cols rounded up to 4, i.e. also over the next row's first elements (no tail mask)."""
    x = inputs["x"].astype(F32)
    over = -x.shape[1] % 4
    following = np.concatenate([x[1:, :over], np.zeros((1, over), F32)])
    m = np.fmax(np.fmax.reduce(x, axis=1), np.fmax.reduce(following, axis=1, initial=-np.inf))[:, None]
    e = np.exp(x - m)
    out: np.ndarray = e / block_sum(e)[:, None]
    return out


def rms_norm_kernel(eps: float | None = 1e-6) -> Kernel:
    def run(inputs: Arrays) -> np.ndarray:
        x, w = inputs["x"].astype(F32), inputs["w"].astype(F32)
        mean_square = block_sum(x * x) / F32(x.shape[1])
        inv = F32(1) / np.sqrt(mean_square + F32(eps or 0))
        return x * inv[:, None] * w

    return run


def layer_norm_kernel(variance: str, eps: float | None = 1e-5) -> Kernel:
    """variance: 'two-pass' (block sums), 'sequential' (one thread per row), 'welford', 'naive' (E[x^2] - E[x]^2),
    'shifted' (E[d^2] - E[d]^2 of d = x - x[0]), or 'shifted-recentred' (as the group_norm template's shifted
    moments: a centred pass where the row's first entry lies more than 4 standard deviations off the mean)."""

    def run(inputs: Arrays) -> np.ndarray:
        x, w, b = (inputs[k].astype(F32) for k in ("x", "w", "b"))
        n = F32(x.shape[1])
        total = block_sum if variance != "sequential" else lambda a: block_sum(a, threads=1)
        if variance == "welford":
            mean, var = welford(x)
        elif variance.startswith("shifted"):
            d = x - x[:, :1]
            shift = block_sum(d) / n
            mean = x[:, 0] + shift
            var = np.maximum(block_sum(d * d) / n - shift * shift, F32(0))
            far = shift * shift > F32(16) * var
            if variance == "shifted-recentred":
                var = np.where(far, block_sum((x - mean[:, None]) ** 2) / n, var)
        else:
            mean = total(x) / n
            var = block_sum(x * x) / n - mean * mean if variance == "naive" else total((x - mean[:, None]) ** 2) / n
        rstd = F32(1) / np.sqrt(var + F32(eps or 0))
        out: np.ndarray = (x - mean[:, None]) * rstd[:, None] * w + b
        return out

    return run


def welford(x: np.ndarray, threads: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Per-thread Welford over strided elements, then Chan's merge in a tree, in fp32."""
    rows, cols = x.shape
    count = np.zeros((rows, threads), F32)
    mean = np.zeros((rows, threads), F32)
    m2 = np.zeros((rows, threads), F32)
    for start in range(0, cols, threads):
        chunk = x[:, start : start + threads]
        width = chunk.shape[1]
        count[:, :width] += 1
        delta = chunk - mean[:, :width]
        mean[:, :width] += delta / count[:, :width]
        m2[:, :width] += delta * (chunk - mean[:, :width])
    while count.shape[1] > 1:
        half = count.shape[1] // 2
        na, nb, total = count[:, :half], count[:, half:], count[:, :half] + count[:, half:]
        share = np.divide(nb, total, out=np.zeros_like(nb), where=total > 0)
        delta = mean[:, half:] - mean[:, :half]
        mean = mean[:, :half] + delta * share
        m2 = m2[:, :half] + m2[:, half:] + delta * delta * na * share
        count = total
    return mean[:, 0], m2[:, 0] / F32(cols)


def vector_add(saturate: bool) -> Kernel:
    def run(inputs: Arrays) -> np.ndarray:
        c = inputs["a"].astype(F32) + inputs["b"].astype(F32)
        top = np.finfo(F32).max
        return np.clip(c, -top, top) if saturate else c

    return run


def verdicts(card: Card, kernel: Kernel) -> dict[str, bool]:
    """Set name -> whether the kernel's output passes, as the worker would judge it (output in the card dtype)."""
    out = card.spec.outputs[0]
    sets = [(w.name, *card.input_set(w)) for w in card.spec.input_sets]
    result = {}
    for name, inputs, refs in [*sets, *card.stress_sets()]:
        with np.errstate(all="ignore"):
            got = kernel(inputs).astype(NUMPY[out.dtype]).reshape(refs[out.name].shape)
        result[name] = bool(out.effective_tolerance().accepts(got, refs[out.name]).all())
    return result


SOFTMAX = ["softmax_f32_small", "softmax_bf16_small"]
LAYER_NORM = ["layer_norm_f32_small", "layer_norm_bf16_small"]
UNSAFE: list[tuple[list[str], str, Kernel, str]] = [
    (SOFTMAX, "softmax without max subtraction", softmax_kernel(max_subtraction=False), "large-logits"),
    (SOFTMAX, "online softmax without a -inf guard", softmax_online(guard_neg_inf=False), "masked"),
    (SOFTMAX, "max over a row's end rounded up to the vector width", softmax_tail_in_max, "large-logits"),
    (["rms_norm_bf16_small"], "rms_norm without eps", rms_norm_kernel(eps=None), "zero-rows"),
    (["rms_norm_bf16_small"], "rms_norm with eps 1e-5 for 1e-6", rms_norm_kernel(eps=1e-5), "tiny"),
    (LAYER_NORM, "layer_norm with var = E[x^2] - E[x]^2", layer_norm_kernel("naive"), "large-mean"),
    (LAYER_NORM, "layer_norm without eps", layer_norm_kernel("two-pass", eps=None), "equal-rows"),
    # On the bf16 card's short rows the cancellation (about the row length) stays within bf16's tolerance.
    (["layer_norm_f32_small"], "moments about each row's first entry", layer_norm_kernel("shifted"), "outliers"),
]
HONEST: list[tuple[list[str], str, Kernel]] = [
    (SOFTMAX, "max-subtracted softmax", softmax_kernel()),
    (SOFTMAX, "fast exp (__expf)", softmax_kernel(exp=fast_exp)),
    (SOFTMAX, "reordered reductions", softmax_kernel(threads=32, reverse=True)),
    (SOFTMAX, "online softmax with a -inf guard", softmax_online(guard_neg_inf=True)),
    (["rms_norm_bf16_small"], "rms_norm", rms_norm_kernel()),
    (LAYER_NORM, "two-pass layer_norm", layer_norm_kernel("two-pass")),
    (LAYER_NORM, "one thread per row, sequential sums", layer_norm_kernel("sequential")),
    (LAYER_NORM, "Welford layer_norm", layer_norm_kernel("welford")),
    (LAYER_NORM, "shifted moments, centred again where the first entry is far", layer_norm_kernel("shifted-recentred")),
]


@pytest.mark.parametrize(
    ("card_name", "kernel", "caught_by"),
    [(c, k, s) for cards, _, k, s in UNSAFE for c in cards],
    ids=[f"{c}-{w}" for cards, w, _, _ in UNSAFE for c in cards],
)
def test_unsafe_rewrites_pass_ordinary_sets_and_fail_a_stress_set(
    card_name: str, kernel: Kernel, caught_by: str
) -> None:
    result = verdicts(load_card(CARDS / card_name), kernel)
    ordinary = {name: ok for name, ok in result.items() if not name.startswith("stress:")}
    assert all(ordinary.values()), f"the ordinary sets must not catch it already: {ordinary}"
    failed = [name for name, ok in result.items() if not ok]
    assert failed and failed[0] == f"stress:{caught_by}", failed


@pytest.mark.parametrize(
    ("card_name", "kernel"),
    [(c, k) for cards, _, k in HONEST for c in cards],
    ids=[f"{c}-{w}" for cards, w, _ in HONEST for c in cards],
)
def test_honest_kernels_pass_every_set(card_name: str, kernel: Kernel) -> None:
    result = verdicts(load_card(CARDS / card_name), kernel)
    assert all(result.values()), [name for name, ok in result.items() if not ok]


def test_vector_add_must_keep_inf() -> None:
    card = Card(spec=small_card("elementwise", "float32"), root=CARDS)
    assert all(verdicts(card, vector_add(saturate=False)).values())
    failed = [name for name, ok in verdicts(card, vector_add(saturate=True)).items() if not ok]
    assert "stress:max-finite" in failed and all(name.startswith("stress:") for name in failed)


# --- the manifest ----------------------------------------------------------------------------------


def test_skipped_sets_are_not_run_and_their_reason_is_shown() -> None:
    spec = small_card("softmax", "float32")
    spec = OperatorCard.model_validate(
        spec.model_dump() | {"stress": {"seed": 3, "skip": {"fully-masked": "the kernel zeroes padding rows"}}}
    )
    listed = {p.label: p.describe() for p in plan(spec)}
    assert listed["stress:fully-masked"] == "stress:fully-masked: skipped: the kernel zeroes padding rows"
    assert "stress:fully-masked" not in [name for name, _, _ in Card(spec=spec, root=CARDS).stress_sets()]
    assert len(list(Card(spec=spec, root=CARDS).stress_sets())) == len(FAMILIES["softmax"].applies) - 1


@pytest.mark.parametrize(
    ("stress", "reference", "field", "words"),
    [
        ({"skip": {"masked": " "}}, None, "stress.skip", "no reason"),
        ({"skip": {"zero-rows": "why not"}}, None, "stress.skip.zero-rows", "a zero row is one of the equal-rows"),
        ({"skip": {"bogus": "why not"}}, None, "stress.skip.bogus", "not a stress set of the softmax family"),
        ({}, "baseline", "stress", "need a NumPy reference"),
    ],
)
def test_bad_stress_tables_say_field_and_fix(
    tmp_path: Path, stress: dict[str, object], reference: str | None, field: str, words: str
) -> None:
    data = small_card("softmax", "float32").model_dump(exclude_defaults=True) | {"stress": stress}
    if reference:
        data["reference"] = {"kind": reference}
    (tmp_path / "card.toml").write_text(to_toml(data))
    with pytest.raises(CardError) as info:
        load_card(tmp_path)
    assert info.value.field == field and words in info.value.problem and info.value.fix


def test_a_baseline_reference_card_runs_stress_sets_only_when_it_skips_them_all(tmp_path: Path) -> None:
    spec = small_card("softmax", "float32")
    skip = dict.fromkeys(FAMILIES["softmax"].applies, "the reference is the baseline kernel")
    loaded = save_card(
        spec.model_copy(update={"reference": Reference(kind="baseline"), "stress": StressSpec(skip=skip)}), tmp_path, {}
    )
    assert list(loaded.stress_sets()) == [] and all(p.skipped for p in plan(loaded.spec))


def test_stress_values_need_a_floating_data_tensor() -> None:
    data = small_card("softmax", "float32").model_dump(exclude_defaults=True)
    data["inputs"][0]["dtype"] = "int32"
    with pytest.raises(ValueError, match="stress values go into input 'x', which is int32"):
        OperatorCard.model_validate(data)


# --- the example cards -----------------------------------------------------------------------------

EXAMPLE_CARDS = sorted(p.parent.name for p in CARDS.glob("*/card.toml"))


@pytest.mark.parametrize("name", EXAMPLE_CARDS)
def test_example_cards_declare_and_run_their_familys_stress_sets(name: str) -> None:
    card = load_card(CARDS / name)
    assert "\n[stress]\nseed = " in card.manifest.read_text()
    assert [p.name for p in plan(card.spec)] == list(FAMILIES[card.spec.family].applies)
    assert not any(p.skipped for p in plan(card.spec))
    if any(card.root.glob("*.npz")):  # small cards: draw them (large ones take seconds and gigabytes)
        sets = list(card.stress_sets())
        assert [label for label, _, _ in sets] == [p.label for p in plan(card.spec)]
        for _, inputs, outputs in sets:
            for tensor in card.spec.inputs:
                assert inputs[tensor.name].shape == tensor.dims(card.spec.sizes)
            assert outputs["y"].shape == card.spec.outputs[0].dims(card.spec.sizes)


# --- the GPU tests' kernels, checked here where no GPU is -------------------------------------------


@pytest.mark.parametrize(
    "kernel",
    [k for k, _ in GPU_UNSAFE] + GPU_HONEST,
    ids=[k.entry for k, _ in GPU_UNSAFE] + [k.entry for k in GPU_HONEST],
)
def test_the_gpu_tests_kernels_pass_the_source_check_and_their_plans_resolve(kernel: GpuKernel) -> None:
    launch = resolve(kernel.plan(), load_card(CARDS / kernel.card).spec)
    problems = check_source(kernel.path().read_text(), kernel.entry, args=launch.args)
    assert [p for p in problems if p.severity == "error"] == []


@pytest.mark.parametrize("rows", [7, 1 << 10, BLOCKWISE_PATTERNS_FROM + 3])
def test_the_row_patterns_are_balanced_and_random_at_every_size(rows: int) -> None:
    """Every pattern on as many rows as the others (give or take one), in places that differ between seeds and
    from the rows' own order. Past BLOCKWISE_PATTERNS_FROM rows (2^28 for an elementwise gelu card, whose rows are
    its elements) they come from runs of `count` rows in random orders: 0.85 s against 8.4 s for a permutation of
    2^26."""
    count = 4
    first = _patterns(np.random.default_rng(1), rows, count)
    assert first.shape == (rows,) and set(np.unique(first)) == set(range(count))
    assert np.ptp(np.bincount(first, minlength=count)) <= 1
    others = [_patterns(np.random.default_rng(seed), rows, count) for seed in (2, 3, 4)]
    assert any(not np.array_equal(first, other) for other in others)
    assert not np.array_equal(first, np.arange(rows) % count)
