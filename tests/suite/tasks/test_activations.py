"""The activation and loss tasks (kernelforge_tui/suite/tasks/activations.py): every reference against an independent
computation (the math module element by element, scipy.special, explicit loops with exact sums), on ordinary values
and on the stress values the elementwise and softmax families write (NaN, +-inf, the largest and the subnormal);
each baseline's fp32 formula, emulated in NumPy, accepted by its own card's check on every set (the reductions'
in the baseline's summation order at 2^22); and the template library serving every card it should, with the
operation read right from the card name and the reduction template's seeds building with nvcc."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from scipy.special import erf, expit, ndtr

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer, elementwise, template_for
from kernelforge_tui.proposers.templates.elementwise import ElementwiseTemplate
from kernelforge_tui.proposers.templates.reduction import ReductionTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import PRECISIONS, Precision, Task
from tests.conftest import typed

F32_MAX = float(np.finfo(np.float32).max)
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -3.0, 3.0, -5.9, 20.0, -20.0, 100.0, -100.0, 1e-30, -1e-30, 1e-45, -1e-45,
           1e30, -1e30, F32_MAX, -F32_MAX, math.inf, -math.inf, math.nan]  # fmt: skip
"""Ordinary, saturating, subnormal, largest, infinite and NaN inputs: what the elementwise stress sets hold."""
SMALLEST = 2**10
ACTIVATIONS = ("relu", "leaky_relu", "elu", "selu", "gelu", "sigmoid", "row_tanh")
REDUCTIONS = ("dot_product", "mse_loss", "hinge_loss")


def _per_element(fn: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.array([fn(v) for v in x.astype(np.float64).ravel().tolist()]).reshape(x.shape)


INDEPENDENT: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": _per_element(lambda v: v if v > 0 or math.isnan(v) else 0.0),
    "leaky_relu": _per_element(lambda v: v if v > 0 else 0.01 * v),
    "elu": _per_element(lambda v: v if v > 0 else math.expm1(v)),
    "selu": _per_element(lambda v: 1.0507009873554805 * (v if v > 0 else 1.6732632423543772 * math.expm1(v))),
    "gelu": lambda x: x.astype(np.float64) * ndtr(x.astype(np.float64)),  # x * Phi(x); -inf * 0 = NaN, as torch
    "sigmoid": lambda x: expit(x.astype(np.float64)),
    "row_tanh": _per_element(math.tanh),
}
"""Each activation as math or scipy.special computes it, sharing nothing with the task's reference."""

F32 = np.float32
BASELINE_FP32: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda v: np.where((v > 0) | np.isnan(v), v, F32(0)),
    "leaky_relu": lambda v: np.where(v > 0, v, F32(0.01) * v),
    "elu": lambda v: np.where(v > 0, v, np.expm1(v)),
    "selu": lambda v: np.where(v > 0, F32(1.0507009873554805) * v, F32(1.7580993408473766) * np.expm1(v)),
    "gelu": lambda v: F32(0.5) * v * (F32(1) + erf(v * F32(0.70710678118654752))),
    "sigmoid": lambda v: F32(1) / (F32(1) + np.exp(-v)),
    "row_tanh": np.tanh,
}
"""Each baseline's expression in float32 arithmetic (NumPy's float32 libm standing in for CUDA's, both within a few
ulp): what the card's tolerance must accept, NaN and infinities included."""


def _sets(card: Card) -> list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Every set a GPU check runs that needs no GPU: the seeded ones and the family's stress sets."""
    seeded = [(s.name, *card.input_set(s)) for s in card.spec.input_sets]
    return seeded + list(card.stress_sets())


def _accepted(card: Card, name: str, out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    spec = next(o for o in card.spec.outputs if o.name == name)
    return spec.effective_tolerance().accepts(out.astype(NUMPY[spec.dtype]), ref)


# Activations --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_references_agree_with_math_on_special_and_ordinary_values(name: str) -> None:
    x = np.concatenate([np.array(SPECIAL, np.float32), np.random.default_rng(3).standard_normal(256, np.float32) * 4])
    sizes = {"rows": 1, "cols": x.size} if name == "row_tanh" else {"n": x.size}
    shaped = x.reshape(1, -1) if name == "row_tanh" else x
    with np.errstate(all="ignore"):
        got = task(name).reference({"x": shaped}, sizes)["y"]
        want = INDEPENDENT[name](shaped)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-300, equal_nan=True)


def test_the_activations_give_torchs_values_at_the_edges() -> None:
    """Written out, the values torch gives (checked against torch 2.13 on CPU): NaN stays NaN in relu, gelu(-inf)
    is NaN (-inf * 0 in x * 0.5 * (1 + erf(x / sqrt 2))), sigmoid saturates, selu overflows at the largest."""
    x = np.array([-math.inf, math.inf, math.nan, -F32_MAX, F32_MAX], np.float32)
    with np.errstate(all="ignore"):
        out = {name: task(name).reference({"x": x}, {"n": x.size})["y"].astype(np.float32) for name in ACTIVATIONS[:6]}
    nan = math.nan
    expected = {
        "relu": [0, math.inf, nan, 0, F32_MAX],
        "leaky_relu": [-math.inf, math.inf, nan, -F32_MAX / 100, F32_MAX],
        "elu": [-1, math.inf, nan, -1, F32_MAX],
        "selu": [-1.7580993, math.inf, nan, -1.7580993, math.inf],
        "gelu": [nan, math.inf, nan, -0.0, F32_MAX],
        "sigmoid": [0, 1, nan, 0, 1],
    }
    for name, values in expected.items():
        np.testing.assert_allclose(out[name], np.array(values, np.float32), rtol=1e-6, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_cards_run_every_elementwise_stress_set_and_their_baseline_formula_passes(
    name: str, precision: Precision, tmp_path: Path
) -> None:
    card = cards.write(task(name), precision, SMALLEST, tmp_path)
    sets = _sets(card)
    assert [label for label, _, _ in sets[2:]] == ["stress:large", "stress:max-finite", "stress:tiny", "stress:nan-inf"]
    for label, inputs, outputs in sets:
        x = inputs["x"]
        with np.errstate(all="ignore"):
            want = INDEPENDENT[name](x).astype(NUMPY[precision])
            emulated = BASELINE_FP32[name](x.astype(np.float32))
        np.testing.assert_allclose(
            outputs["y"].astype(np.float64), want.astype(np.float64), rtol=1e-6, equal_nan=True, err_msg=label
        )
        assert _accepted(card, "y", emulated, outputs["y"]).all(), label
    nan_inf = dict((label, inputs) for label, inputs, _ in sets)["stress:nan-inf"]["x"].astype(np.float32)
    assert np.isnan(nan_inf).any() and np.isinf(nan_inf).any(), "the stress set holds what it says"


def test_gelus_fp32_atol_is_needed_and_enough() -> None:
    """1 + erf(x / sqrt 2) cancels for negative x: with two ulp of erff's error near -1 the fp32 formula is off by
    more than the default atol (1e-8), and within the task's (1e-6) everywhere erff has not yet reached -1."""
    x = np.linspace(-5.9, 0.0, 20001).astype(np.float32)
    exact = INDEPENDENT["gelu"](x)
    erf_off = erf(x.astype(np.float64) / math.sqrt(2.0)) + 2 * 2.0**-24  # two ulp of a value near -1, upwards
    formula = 0.5 * x.astype(np.float64) * (1.0 + erf_off)
    err = np.abs(formula - exact)
    tol = task("gelu").tolerance["float32"]
    assert (err > 1e-8 + 1e-5 * np.abs(exact)).any()
    assert (err <= tol.atol + tol.rtol * np.abs(exact)).all()


# Cross entropy ------------------------------------------------------------------------------------------------------


def _cross_entropy_loop(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Row by row in Python floats with an exact sum, with torch's answers where a row is not finite: NaN for a NaN
    or +inf anywhere in the row or a row of -inf only (log_softmax is NaN there), +inf for a -inf target logit."""
    out = []
    for row, t in zip(logits.astype(np.float64).tolist(), targets.tolist(), strict=True):
        if any(math.isnan(v) or v == math.inf for v in row) or all(v == -math.inf for v in row):
            out.append(math.nan)
            continue
        top = max(row)
        out.append(math.log(math.fsum(math.exp(v - top) for v in row)) + (top - row[t]))  # 2^127 + log 256 would lose
    return np.array(out)


def test_cross_entropy_reference_agrees_with_an_exact_loop() -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((12, 7)) * 3).astype(np.float32)
    logits[1] = [1e4, -1e4, 0, 5, 9999, -3, 2]  # far past exp's range: the max subtraction
    logits[2, 3] = math.nan
    logits[3, 0] = math.inf
    logits[4] = -math.inf
    logits[5, [0, 2]] = -math.inf  # a masked logit, the target among them
    logits[6] = 7.0  # ties: log(7)
    targets = rng.integers(0, 7, 12).astype(np.int32)
    targets[5] = 2
    with np.errstate(all="ignore"):
        got = task("cross_entropy").reference({"logits": logits, "targets": targets}, {"n": 12, "classes": 7})["loss"]
    want = _cross_entropy_loop(logits, targets)
    np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)
    assert math.isinf(got[5]) and got[5] > 0 and np.isnan(got[2:5]).all()
    assert got[6] == pytest.approx(math.log(7.0), rel=1e-15)


def _cross_entropy_fp32(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The baseline's three passes in float32, the sum in its order (column by column): fmax skips NaN as fmaxf."""
    x = logits.astype(np.float32)
    top = np.full(x.shape[0], -np.inf, np.float32)
    for j in range(x.shape[1]):
        top = np.fmax(top, x[:, j])
    total = np.zeros(x.shape[0], np.float32)
    for j in range(x.shape[1]):
        total = total + np.exp(x[:, j] - top)
    return np.log(total) + (top - x[np.arange(x.shape[0]), targets])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_cross_entropy_cards_run_the_softmax_stress_sets_and_the_baseline_formula_passes(
    precision: Precision, tmp_path: Path
) -> None:
    card = cards.write(task("cross_entropy"), precision, 2**14, tmp_path)
    sets = _sets(card)
    stress = [label for label, _, _ in sets[2:]]
    assert stress == [f"stress:{s}" for s in ("large-logits", "masked", "fully-masked", "equal-rows", "max-finite",
                                              "tiny", "nan-inf")]  # fmt: skip
    for label, inputs, outputs in sets:
        with np.errstate(all="ignore"):
            want = _cross_entropy_loop(inputs["logits"], inputs["targets"]).astype(NUMPY[precision])
            emulated = _cross_entropy_fp32(inputs["logits"], inputs["targets"])
        np.testing.assert_allclose(
            outputs["loss"].astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=1e-6, equal_nan=True
        )
        assert _accepted(card, "loss", emulated, outputs["loss"]).all(), label
    masked = dict((label, outputs) for label, _, outputs in sets)["stress:fully-masked"]["loss"]
    assert np.isnan(masked.astype(np.float32)).any(), "a fully masked row is NaN, as torch gives"


def test_cross_entropys_atol_covers_a_swamped_sum() -> None:
    """The max's term is 1 and every other term just under half an ulp of 1 (2^-24): a sequential fp32 sum loses
    them all, a loss of (classes - 1) * 2^-24 = 1.5e-5 that only the task's atol covers."""
    classes = 256
    logits = np.full((1, classes), math.log(2.0**-24 * 0.99), np.float32)
    logits[0, 0] = 0.0
    targets = np.zeros(1, np.int32)
    ref = task("cross_entropy").reference({"logits": logits, "targets": targets}, {"n": 1, "classes": classes})["loss"]
    out = _cross_entropy_fp32(logits, targets)
    assert out[0] == 0.0 and ref[0] > 1e-5
    assert task("cross_entropy").tolerance["float32"].accepts(out, ref).all()


# Reductions ---------------------------------------------------------------------------------------------------------

EXACT_REDUCTIONS: dict[str, Callable[[list[float], list[float]], float]] = {
    "dot_product": lambda a, b: math.fsum(x * y for x, y in zip(a, b, strict=True)),
    "mse_loss": lambda a, b: math.fsum((x - y) ** 2 for x, y in zip(a, b, strict=True)) / len(a),
    "hinge_loss": lambda a, b: math.fsum(max(0.0, 1.0 - x * y) for x, y in zip(a, b, strict=True)) / len(a),
}
TERMS_FP32: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "dot_product": lambda x, y: x * y,
    "mse_loss": lambda x, y: (x - y) * (x - y),
    "hinge_loss": lambda x, y: np.maximum(F32(0), F32(1) - x * y),
}


def _baseline_sum(terms: np.ndarray, dtype: type = np.float32) -> float:
    """The baseline's order: 1024 threads, thread t adding terms t, t + 1024, ... in turn, then the tree halving."""
    threads = 1024
    acc = np.zeros(threads, dtype)
    for row in terms.reshape(-1, threads):
        acc = (acc + row).astype(dtype)
    width = threads // 2
    while width:
        acc[:width] = (acc[:width] + acc[width : 2 * width]).astype(dtype)
        width //= 2
    return float(acc[0])


def _inputs(name: str, card: Card) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inputs, outputs = card.input_set(card.spec.input_sets[0])
    first, second = (inputs[t.name] for t in card.spec.inputs)
    return first, second, outputs[card.spec.outputs[0].name]


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_references_agree_with_exact_sums(name: str, tmp_path: Path) -> None:
    card = cards.write(task(name), "float32", SMALLEST, tmp_path)
    first, second, out = _inputs(name, card)
    exact = EXACT_REDUCTIONS[name](first.astype(np.float64).tolist(), second.astype(np.float64).tolist())
    assert out.shape == (1,) and out[0] == pytest.approx(exact, rel=1e-7)
    raw = task(name).reference({t.name: v for t, v in zip(card.spec.inputs, (first, second), strict=True)}, {})
    assert float(next(iter(raw.values()))[0]) == pytest.approx(exact, rel=1e-13, abs=1e-15)


def test_the_generated_inputs() -> None:
    """dot_product's inputs have std n^-1/4 (the result O(1) at every scale); hinge_loss's targets are +-1."""
    dot = task("dot_product").draw({"n": 2**18}, "float32", 1)
    assert dot["a"].std() == pytest.approx(2**-4.5, rel=0.02) and abs(float(np.dot(dot["a"], dot["b"]))) < 6
    hinge = task("hinge_loss").draw({"n": 2**14}, "bfloat16", 1)
    assert hinge["target"].dtype == ml_dtypes.bfloat16
    assert set(hinge["target"].astype(np.float32).tolist()) == {-1.0, 1.0}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_baselines_order_passes_its_own_check_at_the_largest_scale(
    name: str, precision: Precision, tmp_path: Path
) -> None:
    card = cards.write(task(name), precision, 2**22, tmp_path)
    first, second, ref = _inputs(name, card)
    terms = TERMS_FP32[name](first.astype(np.float32), second.astype(np.float32))
    total = _baseline_sum(terms)
    result = total / terms.size if name != "dot_product" else total
    assert _accepted(card, card.spec.outputs[0].name, np.array([result]), ref).all()


def test_the_dot_products_tolerance_catches_a_dropped_term_and_the_means_a_bf16_accumulator(tmp_path: Path) -> None:
    card = cards.write(task("dot_product"), "float32", 2**22, tmp_path)
    a, b, ref = _inputs("dot_product", card)
    terms = a * b
    terms[np.argmax(np.abs(terms))] = 0.0  # the largest term: a few times n^-1/2 = 4.9e-4
    dropped = _baseline_sum(terms)
    assert not _accepted(card, "out", np.array([dropped]), ref).all()
    mse = cards.write(task("mse_loss"), "float32", 2**14, tmp_path)
    pred, target, loss = _inputs("mse_loss", mse)
    bf16_sum = _baseline_sum((pred - target) ** 2, ml_dtypes.bfloat16) / pred.size
    assert not _accepted(mse, "loss", np.array([bf16_sum]), loss).all()


def test_the_vendors_compute_the_same_outputs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    for name in (*ACTIVATIONS, *REDUCTIONS, "cross_entropy"):
        case: Task = task(name)
        card = cards.write(case, "float32", SMALLEST, tmp_path)
        inputs, outputs = card.input_set(card.spec.input_sets[0])
        assert case.vendor is not None
        got = case.vendor.run(torch, {k: torch.from_numpy(np.array(v)) for k, v in inputs.items()}, card.spec.sizes)
        for spec in card.spec.outputs:
            out = got[spec.name].numpy()
            assert out.shape == outputs[spec.name].shape, name
            assert _accepted(card, spec.name, out, outputs[spec.name]).all(), name


# Templates ----------------------------------------------------------------------------------------------------------


def _card(name: str, precision: Precision = "float32") -> OperatorCard:
    return cards.spec(task(name), precision, SMALLEST)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_templates_serve_every_activation_and_reduction_card_with_its_own_operation(precision: Precision) -> None:
    for name in ACTIVATIONS:
        card = _card(name, precision)
        assert isinstance(template_for(card), ElementwiseTemplate), name
        assert elementwise.operation(card) == ("tanh" if name == "row_tanh" else name)
    for name in REDUCTIONS:
        card = _card(name, precision)
        assert isinstance(template_for(card), ReductionTemplate), name
        assert len(TemplateProposer().seeds(card)) >= 3
    ce = _card("cross_entropy", precision)
    assert template_for(ce) is None
    assert "softmax template" in (TemplateProposer().cannot_serve(ce) or "")


def test_the_operation_is_the_longest_name_standing_as_a_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """`relu` lies inside `leaky_relu` and `elu` inside `selu`, `gelu` and `relu`: the first name found in OPS
    order read leaky_relu cards as relu and selu cards as elu. Whatever the order, the longest word wins."""
    names = {"leaky_relu": "leaky_relu", "selu": "selu", "elu": "elu", "gelu": "gelu", "relu": "relu"}
    for order in (dict(elementwise.OPS), dict(reversed(elementwise.OPS.items()))):
        monkeypatch.setattr(elementwise, "OPS", order)
        for name, op in names.items():
            assert elementwise.operation(_card(name)) == op, (name, list(order)[:3])
    assert elementwise.operation_in(["gelu_tanh_bf16_2x4", "x"], elementwise.OPS) == "gelu_tanh"
    assert elementwise.operation_in(["torch.tanh"], elementwise.OPS) == "tanh"
    assert elementwise.operation_in(["relu6_fp32", "hardtanh"], elementwise.OPS) is None, "relu6 is not relu"


def test_the_reduction_template_renders_one_launch_without_state() -> None:
    template = ReductionTemplate()
    mse = _card("mse_loss", "bfloat16")
    single, plan = template.render(mse, typed(template, mse, {"blocks": 1, "block": 1024, "vec": 8, "unroll": 2}))
    cluster, cluster_plan = template.render(
        mse, typed(template, mse, {"blocks": 8, "block": 256, "vec": 8, "unroll": 1})
    )
    assert plan.grid == [1] and cluster_plan.grid == [8] and plan.args == ["pred", "target", "loss", "(n):i64"]
    assert "cluster_dims" not in single and "__attribute__((cluster_dims(8, 1, 1)))" in cluster
    assert "total / (float)n" in single and "cluster_total / (float)n" in cluster
    for source in (single, cluster):
        assert "atomic" not in source and "__device__ float" not in source.replace("__device__ __forceinline__", "")
    dot = _card("dot_product")
    assert "/ (float)n" not in template.render(dot, typed(template, dot, TemplateProposer().seeds(dot)[0].params))[0]
    assert template.valid(mse, {"blocks": 1, "block": 1024, "vec": 8, "unroll": 4}) is None, "64 floats would spill"


def test_the_reduction_templates_seeds_and_an_activation_seed_build_with_nvcc(
    tmp_path: Path, cubin_cache: Path
) -> None:
    """The seeds of one small card (the single block and the clusters), and the selu seed (expm1f, constants)."""
    builder = Builder(arch="sm_90", cache_dir=cubin_cache, work_dir=tmp_path)
    dot, selu = _card("dot_product"), _card("selu", "bfloat16")
    proposals = [(dot, p) for p in TemplateProposer().seeds(dot)] + [(selu, TemplateProposer().seeds(selu)[0])]
    assert {p.params["blocks"] for _, p in proposals[:-1]} == {1, 2, 4, 8}

    async def build_all() -> list[str]:
        results = await asyncio.gather(
            *(builder.build(p.source, p.plan.entry, resolve(p.plan, card).args) for card, p in proposals)
        )
        problems = []
        for (card, p), result in zip(proposals, results, strict=True):
            errors = [e for e in check_source(p.source, p.plan.entry) if e.severity == "error"]
            stats = result.ptxas.get(p.plan.entry) if result.ok else None
            if errors or not result.ok or stats is None or stats.spill_store_bytes:
                problems.append(f"{card.name} {p.params}: {errors} {result.log[-1500:]} {stats}")
        return problems

    assert asyncio.run(build_all()) == []
