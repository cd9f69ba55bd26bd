"""The dense tasks (kernelforge_tui/suite/tasks/dense.py): every reference against an independent computation on
small sizes (explicit Python loops, a closed form for the matrix power), the sizes each scale gives, the fp32-sum
tolerances against simulated fp32 sums (honest ones pass, TF32 inputs and bf16 partial sums fail), the vendors on
CPU torch, and the matmul and copy templates: serving the cards they should, refusing tiles that do not divide the
sizes, and every seed building with nvcc."""

from __future__ import annotations

import asyncio
import itertools
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.copy import CopyTemplate
from kernelforge_tui.proposers.templates.elementwise import ElementwiseTemplate
from kernelforge_tui.proposers.templates.gemv import GemvTemplate
from kernelforge_tui.proposers.templates.matmul import MatmulTemplate
from kernelforge_tui.proposers.templates.matrix_power import MatrixPowerTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import PRECISIONS, Precision, Task
from tests.conftest import typed

DENSE = (
    "reverse_array",
    "matrix_copy",
    "matrix_transpose",
    "matrix_scalar_mul",
    "matrix_vector_mul",
    "matrix_mul",
    "square_matrix_mul",
    "matrix_power",
    "high_order_contraction",
)
SMALLEST = 2**10


def _normal(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, *shape]).standard_normal(shape)


def _reference(name: str, sizes: dict[str, int], **inputs: np.ndarray) -> dict[str, np.ndarray]:
    return task(name).reference(inputs, sizes)


# References ---------------------------------------------------------------------------------------------------------


def test_the_copies_move_every_element_where_it_belongs() -> None:
    x = _normal(7)
    assert _reference("reverse_array", {"n": 7}, x=x)["y"].tolist() == [x[6 - i] for i in range(7)]
    a = _normal(5, 3)
    copied = _reference("matrix_copy", {"rows": 5, "cols": 3}, A=a)["B"]
    transposed = _reference("matrix_transpose", {"rows": 5, "cols": 3}, A=a)["B"]
    assert transposed.shape == (3, 5)
    for i, j in itertools.product(range(5), range(3)):
        assert copied[i, j] == a[i, j] and transposed[j, i] == a[i, j]


def test_matrix_scalar_mul_is_ieee_multiplication() -> None:
    a = np.array([[1.5, -2.0], [np.inf, 0.0]], dtype=np.float32)
    for s in (3.0, -0.5, 0.0):
        with np.errstate(invalid="ignore"):  # inf * 0 is NaN, on purpose
            got = _reference("matrix_scalar_mul", {"side": 2}, A=a, s=np.array([s], dtype=np.float32))["B"]
        want = [[float(v) * s if not (math.isinf(v) and s == 0) else math.nan for v in row] for row in a.tolist()]
        np.testing.assert_array_equal(got, want)


def test_the_products_agree_with_explicit_loops() -> None:
    a, b, x = _normal(3, 4), _normal(4, 5), _normal(4)
    product = _reference("matrix_mul", {"M": 3, "N": 5, "K": 4}, A=a, B=b)["C"]
    c, d = _normal(4, 4), _normal(4, 4, seed=1)
    square = _reference("square_matrix_mul", {"n": 4}, A=c, B=d)["C"]
    matvec = _reference("matrix_vector_mul", {"M": 3, "K": 4}, A=a, x=x)["y"]
    for i, j in itertools.product(range(3), range(5)):
        assert product[i, j] == pytest.approx(math.fsum(a[i, k] * b[k, j] for k in range(4)), rel=1e-14)
    for i, j in itertools.product(range(4), range(4)):
        assert square[i, j] == pytest.approx(math.fsum(c[i, k] * d[k, j] for k in range(4)), rel=1e-14)
    for i in range(3):
        assert matvec[i] == pytest.approx(math.fsum(a[i, k] * x[k] for k in range(4)), rel=1e-14)


def test_matrix_power_agrees_with_repeated_loops_and_a_rotations_closed_form() -> None:
    a = _normal(4, 4)
    power = _reference("matrix_power", {"n": 4}, A=a)["C"]
    looped = np.eye(4).tolist()
    for _ in range(4):
        looped = [[math.fsum(looped[i][k] * a[k, j] for k in range(4)) for j in range(4)] for i in range(4)]
    np.testing.assert_allclose(power, looped, rtol=1e-12, atol=1e-12)
    angle = 0.3
    rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    turned = _reference("matrix_power", {"n": 2}, A=rotation)["C"]
    np.testing.assert_allclose(
        turned, [[math.cos(4 * angle), -math.sin(4 * angle)], [math.sin(4 * angle), math.cos(4 * angle)]]
    )


def test_the_contraction_agrees_with_five_nested_loops() -> None:
    na, nb, nc, nd, ne = 2, 3, 4, 5, 6
    a, b = _normal(na, nd, ne), _normal(nd, nb, ne, nc)
    got = _reference("high_order_contraction", {"a": na, "b": nb, "c": nc, "d": nd, "e": ne}, A=a, B=b)["C"]
    assert got.shape == (na, nb, nc)
    for i, j, k in itertools.product(range(na), range(nb), range(nc)):
        terms = (a[i, d, e] * b[d, j, e, k] for d in range(nd) for e in range(ne))
        assert got[i, j, k] == pytest.approx(math.fsum(terms), rel=1e-13, abs=1e-13)


# Sizes, inputs, tolerances ------------------------------------------------------------------------------------------


def test_the_sizes_at_each_scale() -> None:
    for scale in task("matrix_mul").scales:
        side = math.isqrt(scale)
        assert task("matrix_mul").sizes(scale) == {"M": 2 * side, "N": side, "K": side // 2}
        assert task("matrix_transpose").sizes(scale) == {"rows": 2 * side, "cols": side // 2}
        sizes = task("high_order_contraction").sizes(scale)
        assert sizes["a"] == side and sizes["b"] * sizes["c"] == sizes["d"] * sizes["e"] == side
        assert sizes["b"] != sizes["c"], "a mix-up of b and c changes the shape"
    assert task("square_matrix_mul").sizes(2**22) == {"n": 2048}
    with pytest.raises(ValueError, match="even powers of two"):
        task("square_matrix_mul").sizes(2**11)


def test_matrix_powers_inputs_keep_every_power_bounded() -> None:
    case = task("matrix_power")
    for n in (32, 512):
        a = case.draw({"n": n}, "bfloat16", seed=1)["A"]
        assert a.dtype == ml_dtypes.bfloat16
        rms = float(np.sqrt((case.reference({"A": a}, {"n": n})["C"] ** 2).mean()))
        assert 0.3 / math.sqrt(n) < rms < 3 / math.sqrt(n)


def _sequential(a: np.ndarray, b: np.ndarray, partial: type = np.float32) -> np.ndarray:
    """a @ b as a thread sums it: fp32 products added one k at a time, each partial sum rounded to `partial`."""
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for k in range(a.shape[1]):
        acc = (acc + a[:, k : k + 1] * b[k : k + 1, :]).astype(partial).astype(np.float32)
    return acc


def _tf32(x: np.ndarray) -> np.ndarray:
    """fp32 rounded to TF32's 10 mantissa bits (to nearest)."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _failing(case: Task, precision: Precision, out: np.ndarray, ref: np.ndarray) -> float:
    """The share of outputs the task's check refuses (the reference rounded to the precision, as the card does)."""
    dtype = np.float32 if precision == "float32" else ml_dtypes.bfloat16
    expected = ref.astype(dtype).astype(np.float64)
    return 1.0 - float(case.tolerance[precision].accepts(out.astype(dtype), expected).mean())


def test_the_sum_tolerance_passes_fp32_sums_and_refuses_tf32_and_bf16_partial_sums() -> None:
    case = task("square_matrix_mul")  # sums of 2048 terms at 2^22
    a, b = _normal(64, 2048).astype(np.float32), _normal(2048, 64).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    honest = _sequential(a, b)
    assert np.abs(honest - ref).max() < case.tolerance["float32"].atol / 4
    assert _failing(case, "float32", honest, ref) == 0.0
    assert _failing(case, "float32", _sequential(_tf32(a), _tf32(b)), ref) > 0.5
    a16, b16 = a.astype(ml_dtypes.bfloat16).astype(np.float32), b.astype(ml_dtypes.bfloat16).astype(np.float32)
    ref16 = a16.astype(np.float64) @ b16.astype(np.float64)
    assert _failing(case, "bfloat16", _sequential(a16, b16), ref16) == 0.0
    assert _failing(case, "bfloat16", _sequential(a16, b16, ml_dtypes.bfloat16), ref16) > 0.5


def test_matrix_powers_tolerance_passes_an_fp32_chain_and_refuses_tf32() -> None:
    case = task("matrix_power")
    a = case.draw({"n": 256}, "float32", seed=1)["A"]
    ref = case.reference({"A": a}, {"n": 256})["C"]
    chain, tf32_chain = a, _tf32(a)
    for _ in range(3):  # the baseline's r <- r A, POWER - 1 times
        chain, tf32_chain = _sequential(chain, a), _sequential(_tf32(tf32_chain), _tf32(a))
    assert np.abs(chain - ref).max() < case.tolerance["float32"].atol / 4
    assert _failing(case, "float32", chain, ref) == 0.0
    assert _failing(case, "float32", tf32_chain, ref) > 0.1


def test_the_copies_are_checked_bit_exactly() -> None:
    for name in ("reverse_array", "matrix_copy", "matrix_transpose"):
        for precision in PRECISIONS:
            tolerance = task(name).tolerance[precision]
            one = np.array([1.0], dtype=np.float32)
            assert tolerance.accepts(one, one).all() and not tolerance.accepts(np.nextafter(one, 2), one).any()


def test_matrix_scalar_mul_runs_the_elementwise_stress_sets_on_both_inputs(tmp_path: Path) -> None:
    card = cards.write(task("matrix_scalar_mul"), "float32", SMALLEST, tmp_path)
    sets = {name: (inputs, outputs) for name, inputs, outputs in card.stress_sets()}
    assert set(sets) == {"stress:large", "stress:max-finite", "stress:tiny", "stress:nan-inf"}
    inputs, outputs = sets["stress:nan-inf"]
    assert not np.isfinite(inputs["s"]).all() and not np.isfinite(outputs["B"]).any()


def test_the_vendors_compute_the_same_outputs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    for name in DENSE:
        case = task(name)
        card = cards.write(case, "float32", SMALLEST, tmp_path)
        inputs, outputs = card.input_set(card.spec.input_sets[0])
        assert case.vendor is not None
        got = case.vendor.run(torch, {k: torch.from_numpy(np.array(v)) for k, v in inputs.items()}, card.spec.sizes)
        for spec in card.spec.outputs:
            out = got[spec.name].numpy()
            assert out.shape == outputs[spec.name].shape, name
            assert spec.effective_tolerance().accepts(out, outputs[spec.name]).all(), name


# Templates ----------------------------------------------------------------------------------------------------------


def _card(name: str, precision: Precision = "float32", scale: int = SMALLEST) -> OperatorCard:
    return cards.spec(task(name), precision, scale)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_templates_serve_the_dense_cards_they_are_for(precision: Precision) -> None:
    for name in ("matrix_mul", "square_matrix_mul", "high_order_contraction"):
        assert isinstance(template_for(_card(name, precision)), MatmulTemplate), name
    for name in ("reverse_array", "matrix_copy", "matrix_transpose"):
        assert isinstance(template_for(_card(name, precision)), CopyTemplate), name
    for name in ("vector_add", "matrix_scalar_mul"):
        assert isinstance(template_for(_card(name, precision)), ElementwiseTemplate), name
    assert isinstance(template_for(_card("matrix_vector_mul", precision)), GemvTemplate)
    assert isinstance(template_for(_card("matrix_power", precision)), MatrixPowerTemplate)


def test_the_matmul_template_refuses_tiles_that_do_not_divide_the_sizes() -> None:
    card = _card("matrix_mul")  # M = 64, N = 32, K = 16
    template = MatmulTemplate()
    base = template.seed_params(card)[-1]  # 16 x 16 x 16: valid at every suite size
    assert template.problem(card, typed(template, card, base)) is None
    assert template.problem(card, typed(template, card, {**base, "bn": 64})) == "bn 64 does not divide N = 32"
    assert template.problem(card, typed(template, card, {**base, "bk": 32})) == "bk 32 does not divide K = 16"
    assert (
        template.problem(card, typed(template, card, {**base, "bm": 128, "bn": 32, "tm": 4, "tn": 4}))
        == "bm 128 does not divide M = 64"
    )
    assert "threads per block" in str(template.problem(card, typed(template, card, {**base, "tm": 8, "tn": 8})))
    assert typed(template, card, base) == template.valid(card, {**base, "layout": "blocked"}), (
        "a 1 x 1 micro-tile has one layout"
    )
    space = template.space(card)
    assert all(bk % vec == 0 for bk in space["bk"] for vec in space["vec"])  # type: ignore[operator]
    assert all(bn % vec == 0 and bn >= tn for bn in space["bn"] for vec in space["vec"] for tn in space["tn"])  # type: ignore[operator]


def test_the_copy_template_needs_vectors_that_divide_n() -> None:
    card = _card("reverse_array").model_copy(update={"sizes": {"n": 1002}})
    template = CopyTemplate()
    base = template.seed_params(card)[0]
    assert (
        template.problem(card, typed(template, card, {**base, "vec": 4}))
        == "vec 4 does not divide n = 1002 (chunks would be misaligned)"
    )
    assert template.problem(card, typed(template, card, {**base, "vec": 2})) is None
    odd = _card("matrix_transpose").model_copy(update={"sizes": {"rows": 100, "cols": 37}})
    assert template.problem(odd, typed(template, odd, template.seed_params(odd)[0])) is None, (
        "edge tiles are bounds-checked"
    )


def test_every_seed_of_the_new_templates_builds_with_nvcc(tmp_path: Path, cubin_cache: Path) -> None:
    """Every seed on one small card per template: the bf16 products (bf16 loads and stores) and a bf16 transpose
    (2-byte tiles); and the copy template's other kernel, the flat one, with its mirrored chunks (fp32 reverse)."""
    builder = Builder(arch="sm_90", cache_dir=cubin_cache, work_dir=tmp_path)
    proposals = []
    for card in (_card("square_matrix_mul", "bfloat16", 2**14), _card("matrix_transpose", "bfloat16", 2**14)):
        template = template_for(card)
        assert template is not None
        seeds = TemplateProposer().seeds(card)
        assert len(seeds) == len(template.seed_params(card)), f"{card.name}: every seed is valid and distinct"
        proposals += [(card, p) for p in seeds]
    reverse = _card("reverse_array", "float32", 2**14)
    proposals.append((reverse, TemplateProposer().seeds(reverse)[0]))

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
