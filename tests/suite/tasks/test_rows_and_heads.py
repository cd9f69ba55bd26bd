"""The rows tasks (kernelforge_tui/suite/tasks/rows_and_heads.py): every reference against an independent computation on
small sizes (explicit loops with exact sums, scipy, complex arithmetic, attention over the union of two key sets), the
stress sets of softmax and the norms through the references with the values torch gives there, top-k's tie rule on the
tied rows its cards draw, and the template library serving the softmax and norm cards."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit, logsumexp, softmax

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.elementwise import ElementwiseTemplate, operation
from kernelforge_tui.proposers.templates.row_reductions import EPS, RowTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import PRECISIONS, Precision
from kernelforge_tui.suite.tasks.rows_and_heads import LAYER_NORM_EPS, RMS_NORM_EPS, TASKS

RNG = np.random.default_rng(13)
ROW_FAMILIES = ("softmax", "layer_norm", "rms_norm")


def _normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def _run(name: str, sizes: dict[str, int], **inputs: np.ndarray) -> dict[str, np.ndarray]:
    return task(name).reference(inputs, sizes)


# References against independent computations ------------------------------------------------------------------------


def _layer_norm_rows(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """Row by row with exact (fsum) statistics: NaN and inf propagate as Python's float arithmetic says."""
    out = np.empty(x.shape)
    for r, row in enumerate(x.astype(np.float64)):
        values = row.tolist()
        mean = math.fsum(values) / len(values)
        var = math.fsum((v - mean) ** 2 for v in values) / len(values)
        out[r] = [(v - mean) / math.sqrt(var + eps) * wj + bj for v, wj, bj in zip(values, w, b, strict=True)]
    return out


def _rms_norm_rows(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty(x.shape)
    for r, row in enumerate(x.astype(np.float64)):
        values = row.tolist()
        scale = 1.0 / math.sqrt(math.fsum(v * v for v in values) / len(values) + eps)
        out[r] = [v * scale * wj for v, wj in zip(values, w, strict=True)]
    return out


def test_softmax_matches_scipy_with_masked_entries() -> None:
    x = _normal(5, 9) * 3
    x[1, [0, 4]] = -np.inf
    got = _run("softmax", {"rows": 5, "cols": 9}, x=x)["y"]
    np.testing.assert_allclose(got, softmax(x, axis=-1), rtol=1e-13)
    assert (got[1, [0, 4]] == 0).all()


def test_layer_norm_and_rms_norm_match_explicit_loops() -> None:
    x, w, b = _normal(4, 33) * 5 + 7, _normal(33), _normal(33)
    sizes = {"rows": 4, "cols": 33}
    got = _run("layer_norm", sizes, x=x, w=w, b=b)["y"]
    np.testing.assert_allclose(got, _layer_norm_rows(x, w, b, 1e-5), rtol=1e-10, atol=1e-12)
    got = _run("rms_norm", sizes, x=x, w=w)["y"]
    np.testing.assert_allclose(got, _rms_norm_rows(x, w, 1e-6), rtol=1e-12)


def test_batch_norm_normalises_each_channel_over_the_batch() -> None:
    n, c, h, w = 3, 4, 2, 5
    x, weight, bias = _normal(n, c, h, w) * 2 + 1, _normal(c), _normal(c)
    got = _run("batch_norm", {"n": n, "c": c, "h": h, "w": w}, x=x, weight=weight, bias=bias)["y"]
    for ch in range(c):
        values = x[:, ch].ravel().tolist()
        mean = math.fsum(values) / len(values)
        var = math.fsum((v - mean) ** 2 for v in values) / len(values)  # biased, as torch normalises
        expected = (x[:, ch] - mean) / math.sqrt(var + 1e-5) * weight[ch] + bias[ch]
        np.testing.assert_allclose(got[:, ch], expected, rtol=1e-12, atol=1e-12)


def _attend(query: np.ndarray, keys: np.ndarray, values: np.ndarray, bias: list[float]) -> list[float]:
    """One query over its keys with explicit sums: exp(score - max) weights, normalised."""
    scores = [math.fsum(query * key) / math.sqrt(len(query)) + b for key, b in zip(keys, bias, strict=True)]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    return [math.fsum(wt * v for wt, v in zip(weights, values[:, c], strict=True)) / math.fsum(weights)
            for c in range(values.shape[1])]  # fmt: skip


def test_softmax_attention_matches_explicit_loops() -> None:
    heads, seq, d = 2, 5, 8
    q, k, v = _normal(heads, seq, d), _normal(heads, seq, d), _normal(heads, seq, d)
    got = _run("softmax_attention", {"heads": heads, "seq": seq, "d": d}, q=q, k=k, v=v)["o"]
    for h in range(heads):
        for i in range(seq):
            np.testing.assert_allclose(got[h, i], _attend(q[h, i], k[h], v[h], [0.0] * seq), rtol=1e-10, atol=1e-12)


def test_triangle_attention_matches_explicit_loops() -> None:
    """Query (i, j) attends over the keys (i, k) of its own row, with the pair bias of (j, k)."""
    n, heads, c = 3, 2, 4
    q, k, v = _normal(n, n, heads, c), _normal(n, n, heads, c), _normal(n, n, heads, c)
    bias = _normal(n, n, heads)
    got = _run("triangle_attention", {"n": n, "heads": heads, "c": c}, q=q, k=k, v=v, bias=bias)["o"]
    for i in range(n):
        for j in range(n):
            for h in range(heads):
                expected = _attend(q[i, j, h], k[i, :, h], v[i, :, h], bias[j, :, h].tolist())
                np.testing.assert_allclose(got[i, j, h], expected, rtol=1e-10, atol=1e-12)


def test_rope_is_a_complex_rotation_of_each_half_pair() -> None:
    """(x[p] + i x[p + d/2]) * (cos + i sin), with the generator's tables of unit length."""
    sizes = {"tokens": 3, "heads": 2, "d": 8}
    inputs = task("rope").draw(sizes, "float32", seed=4)
    cos, sin = inputs["cos_cache"].astype(np.float64), inputs["sin_cache"].astype(np.float64)
    np.testing.assert_allclose(cos**2 + sin**2, 1.0, rtol=1e-6)
    x = inputs["x"].astype(np.float64)
    rotated = (x[..., :4] + 1j * x[..., 4:]) * (cos + 1j * sin)[:, None, :]
    got = task("rope").reference(inputs, sizes)["y"]
    np.testing.assert_allclose(got, np.concatenate([rotated.real, rotated.imag], axis=-1), rtol=1e-12, atol=1e-14)


def test_swiglu_and_silu_and_mul_gate_with_silu() -> None:
    gate, up = _normal(3, 6) * 4, _normal(3, 6)
    gate[0, :2] = [np.inf, -np.inf]
    got = _run("swiglu", {"tokens": 3, "hidden": 6}, gate=gate, up=up)["y"]
    np.testing.assert_allclose(got[:, 2:], gate[:, 2:] * expit(gate[:, 2:]) * up[:, 2:], rtol=1e-13)
    assert got[0, 0] == np.inf * up[0, 0] and np.isnan(got[0, 1]), "silu(inf) = inf, silu(-inf) = NaN, as torch's"
    x = _normal(3, 12) * 4
    got = _run("silu_and_mul", {"tokens": 3, "hidden": 6}, x=x)["y"]
    for t in range(3):
        for j in range(6):
            a = x[t, j]
            assert got[t, j] == pytest.approx(a / (1 + math.exp(-a)) * x[t, 6 + j], rel=1e-13)


def test_merge_attn_states_equals_attention_over_both_key_sets() -> None:
    """Partial states of two disjoint key sets, merged, are attention over their union."""
    tokens, heads, d, keys = 3, 2, 4, (5, 7)
    scores = [_normal(tokens, heads, n) * 3 for n in keys]
    values = [_normal(n, d) for n in keys]
    partial = [softmax(s, axis=-1) @ v for s, v in zip(scores, values, strict=True)]
    lse = [logsumexp(s, axis=-1).T for s in scores]  # [heads, tokens], vLLM's layout
    got = _run(
        "merge_attn_states",
        {"tokens": tokens, "heads": heads, "d": d},
        prefix_output=partial[0],
        prefix_lse=lse[0],
        suffix_output=partial[1],
        suffix_lse=lse[1],
    )
    union = np.concatenate(scores, axis=-1)
    np.testing.assert_allclose(got["output"], softmax(union, axis=-1) @ np.concatenate(values), rtol=1e-12)
    np.testing.assert_allclose(got["output_lse"], logsumexp(union, axis=-1).T, rtol=1e-13)


def test_top_k_orders_descending_with_ties_to_the_lower_index() -> None:
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0, -0.0, 0.0], [0.0, -0.0, -1.0, 0.0, -0.0, -2.0, 5.0]])
    got = _run("top_k", {"rows": 2, "cols": 7, "k": 4}, x=x)
    assert got["indices"].tolist() == [[1, 2, 4, 3], [6, 0, 1, 3]], "-0.0 ties with +0.0"
    assert got["values"].tolist() == [[3.0, 3.0, 3.0, 2.0], [5.0, 0.0, 0.0, 0.0]]
    assert got["indices"].dtype == np.int32


# Drawn cards ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
def test_top_k_cards_draw_tied_rows_and_the_reference_keeps_the_rule(precision: Precision, tmp_path: Path) -> None:
    """Ties inside the top k and across its boundary (the k-th value repeated beyond it, where the rule decides
    which index gets in) in every drawn set; the indices match a Python sort on (-value, index)."""
    card = cards.write(task("top_k"), precision, 2**14, tmp_path)
    inputs, outputs = card.input_set(card.spec.input_sets[0])
    x, k = inputs["x"].astype(np.float64), card.spec.sizes["k"]
    inside = boundary = 0
    for row, indices, values in zip(x, outputs["indices"], outputs["values"].astype(np.float64), strict=True):
        assert indices.tolist() == sorted(range(row.size), key=lambda j: (-row[j], j))[:k]
        assert values.tolist() == row[indices].tolist()
        inside += len(set(values.tolist())) < k
        boundary += int((row == values[-1]).sum() > (values == values[-1]).sum())
    assert inside >= 4 and boundary >= 4, (inside, boundary)


def _stress(name: str, precision: Precision, tmp_path: Path) -> tuple[Card, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The card at 2^14 (16 rows of 1024) and each stress set's x (as float64) and the reference's y (as the card
    gives it: rounded to the dtype)."""
    card = cards.write(task(name), precision, 2**14, tmp_path)
    sets = {label: (inputs["x"].astype(np.float64), out["y"]) for label, inputs, out in card.stress_sets()}
    return card, sets


def _agrees(card: Card, got: np.ndarray, expected: np.ndarray) -> None:
    """The reference's output within the card's tolerance of an independent float64 computation rounded to the
    same dtype, NaN exactly where that is NaN."""
    spec = card.spec.outputs[0]
    accepted = spec.effective_tolerance().accepts(got, expected.astype(NUMPY[spec.dtype]))
    assert accepted.all(), f"{(~accepted).sum()} of {accepted.size} elements off"


def _weights(card: Card, *names: str) -> list[np.ndarray]:
    """The weights every stress set shares (stress values go into x only)."""
    inputs = card.draw(card.spec.stress.seed)
    return [inputs[name].astype(np.float64) for name in names]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_softmax_stress_sets_give_what_torch_gives(precision: Precision, tmp_path: Path) -> None:
    card, sets = _stress("softmax", precision, tmp_path)
    names = ("large-logits", "masked", "fully-masked", "equal-rows", "max-finite", "tiny", "nan-inf")
    assert sorted(sets) == sorted(f"stress:{n}" for n in names)
    for x, y in sets.values():
        with np.errstate(invalid="ignore"):  # scipy's -inf - -inf on fully masked rows: the NaN torch gives
            _agrees(card, y, softmax(x, axis=-1))
    cols = card.spec.sizes["cols"]
    x, y = sets["stress:fully-masked"]
    padding = np.isneginf(x).all(axis=1)
    assert padding.any() and np.isnan(y[padding]).all(), "an all -inf row is NaN, as torch.softmax gives"
    assert (y[~padding][np.isneginf(x[~padding])] == 0).all()
    np.testing.assert_allclose(y[~padding].astype(np.float64).sum(axis=1), 1.0, rtol=2e-2)
    x, y = sets["stress:nan-inf"]
    poisoned = (np.isnan(x) | np.isposinf(x)).any(axis=1)
    assert poisoned.any() and np.isnan(y[poisoned]).all(), "a NaN or +inf makes its row NaN"
    masked_only = np.isneginf(x).any(axis=1)
    assert masked_only.any() and np.isfinite(y[masked_only]).all() and (y[np.isneginf(x)] == 0).all()
    _, y = sets["stress:equal-rows"]
    assert (y.astype(np.float64) == 1.0 / cols).all(), "ties: every entry is exactly 1/cols"
    x, y = sets["stress:large-logits"]
    assert np.abs(x).max() > 1e3 and np.isfinite(y.astype(np.float64)).all()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_layer_norm_stress_sets_give_what_torch_gives(precision: Precision, tmp_path: Path) -> None:
    card, sets = _stress("layer_norm", precision, tmp_path)
    names = ("large-mean", "equal-rows", "large", "tiny", "outliers", "nan-inf")
    assert sorted(sets) == sorted(f"stress:{n}" for n in names)
    w, b = _weights(card, "w", "b")
    for x, y in sets.values():
        _agrees(card, y, _layer_norm_rows(x, w, b, LAYER_NORM_EPS))
    _, y = sets["stress:equal-rows"]
    assert (y.astype(np.float64) == b).all(), "a constant row: x - mean = 0, so y = b exactly"
    x, y = sets["stress:nan-inf"]
    poisoned = ~np.isfinite(x).all(axis=1)
    assert poisoned.any() and (~poisoned).any()
    assert np.isnan(y[poisoned].astype(np.float64)).all() and np.isfinite(y[~poisoned].astype(np.float64)).all()
    for label in ("stress:large-mean", "stress:large", "stress:tiny", "stress:outliers"):
        assert np.isfinite(sets[label][1].astype(np.float64)).all(), label


@pytest.mark.parametrize("precision", PRECISIONS)
def test_rms_norm_stress_sets_give_what_torch_gives(precision: Precision, tmp_path: Path) -> None:
    card, sets = _stress("rms_norm", precision, tmp_path)
    assert sorted(sets) == sorted(f"stress:{n}" for n in ("large", "zero-rows", "tiny", "nan-inf"))
    (w,) = _weights(card, "w")
    for x, y in sets.values():
        _agrees(card, y, _rms_norm_rows(x, w, RMS_NORM_EPS))
    x, y = sets["stress:zero-rows"]
    zero = (x == 0).all(axis=1)
    assert zero.any() and (y[zero].astype(np.float64) == 0).all(), "eps decides: y = 0, not 0 * rsqrt(0)"
    x, y = sets["stress:nan-inf"]
    y = y.astype(np.float64)
    with_nan, with_inf = np.isnan(x).any(axis=1), np.isinf(x).any(axis=1)
    assert with_nan.any() and np.isnan(y[with_nan]).all()
    assert with_inf.any() and (np.isnan(y[with_inf]) == np.isinf(x[with_inf])).all(), "NaN at the inf only"
    assert (y[with_inf][np.isfinite(x[with_inf])] == 0).all(), "an inf makes the scale 0"


# Templates -----------------------------------------------------------------------------------------------------------

TEMPLATE_EPS = {"layer_norm": LAYER_NORM_EPS, "rms_norm": RMS_NORM_EPS}


@pytest.mark.parametrize("name", ROW_FAMILIES)
def test_the_row_template_serves_every_card_with_the_tasks_eps(name: str) -> None:
    for precision in PRECISIONS:
        for scale in task(name).scales:
            spec = cards.spec(task(name), precision, scale)
            assert isinstance(template_for(spec), RowTemplate), spec.name
            assert TemplateProposer().seeds(spec), spec.name
    if name in TEMPLATE_EPS:
        assert float(EPS[name].rstrip("f")) == TEMPLATE_EPS[name], "the template bakes its eps into every kernel"


async def test_the_row_templates_seeds_pass_the_source_check_and_one_builds(tmp_path: Path, cubin_cache: Path) -> None:
    """Every seed of each family's smallest card passes the source check with its plan's arguments; one (layer norm,
    the longest kernel) goes through nvcc: tests/proposers/templates/test_templates.py builds the row template at other
    shapes."""
    first = []
    for name in ROW_FAMILIES:
        spec = cards.spec(task(name), "bfloat16", 2**10)
        seeds = TemplateProposer().seeds(spec)
        assert len(seeds) >= 3, name
        for proposal in seeds:
            args = resolve(proposal.plan, spec).args
            problems = check_source(proposal.source, proposal.plan.entry, args=args)
            assert not [p for p in problems if p.severity == "error"], (name, proposal.params)
        first.append((spec, seeds[0]))
    spec, proposal = first[ROW_FAMILIES.index("layer_norm")]
    builder = Builder(arch="sm_90", flags=("-O3",), cache_dir=cubin_cache, work_dir=tmp_path)
    result = await builder.build(proposal.source, proposal.plan.entry, resolve(proposal.plan, spec).args)
    assert result.ok, result.log[-2000:]


def test_the_elementwise_template_serves_swiglu_and_the_merged_layout() -> None:
    swiglu = cards.spec(task("swiglu"), "bfloat16", 2**14)
    assert isinstance(template_for(swiglu), ElementwiseTemplate) and operation(swiglu) == "swiglu"
    merged = cards.spec(task("silu_and_mul"), "float32", 2**14)
    assert isinstance(template_for(merged), ElementwiseTemplate) and operation(merged) == "silu_and_mul"
    assert [t.name for t in TASKS if template_for(cards.spec(t, "float32", 2**14)) is not None] == [
        "softmax",
        "layer_norm",
        "rms_norm",
        "softmax_attention",
        "swiglu",
        "silu_and_mul",
        "triangle_attention",
    ]
