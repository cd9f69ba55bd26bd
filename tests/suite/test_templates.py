"""The template library on the suite tasks it gained: matrix_scalar_mul and silu_and_mul (the elementwise template's
scalar and split layouts), monte_carlo_integration (the reduction template's point terms), simpson_integration (the
row reduction template), matrix_vector_mul (the gemv template) and max_pooling_2d (the pooling template's 2x2 max).

Each is served at every scale and precision, every seed passing the builder's source check with the card's
arguments; params that do not fit a card's sizes are refused, and so are cards whose shapes the mode cannot read;
one seed of each new mode builds with nvcc on the smallest card. That the kernels compute the references is the
GPU's to prove (a CPU emulation of them on small cards, every seeded and stress set, agreed with the references)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.common import Template
from kernelforge_tui.proposers.templates.elementwise import ElementwiseTemplate
from kernelforge_tui.proposers.templates.gemv import GemvTemplate
from kernelforge_tui.proposers.templates.pooling import PoolingTemplate
from kernelforge_tui.proposers.templates.reduction import ReductionTemplate, RowReductionTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Precision, Tensor
from tests.conftest import typed

SMALLEST = 2**10
SERVED: dict[str, type[Template]] = {
    "matrix_scalar_mul": ElementwiseTemplate,
    "silu_and_mul": ElementwiseTemplate,
    "monte_carlo_integration": ReductionTemplate,
    "simpson_integration": RowReductionTemplate,
    "matrix_vector_mul": GemvTemplate,
    "max_pooling_2d": PoolingTemplate,
}


def _card(name: str, precision: Precision = "float32", **changes: Any) -> OperatorCard:
    """The task's smallest card, with its declaration changed (other sizes, other tensors) where asked."""
    return cards.spec(dataclasses.replace(task(name), **changes), precision, SMALLEST)


def _template(card: OperatorCard) -> Template:
    template = template_for(card)
    assert template is not None, TemplateProposer().cannot_serve(card)
    return template


@pytest.mark.parametrize("name", SERVED)
def test_each_task_is_served_at_every_scale_and_precision_by_seeds_that_pass_the_source_check(name: str) -> None:
    case = task(name)
    for precision, scale in itertools.product(case.precisions, case.scales):
        spec = cards.spec(case, precision, scale)
        assert type(template_for(spec)) is SERVED[name], spec.name
        seeds = TemplateProposer().seeds(spec)
        assert len(seeds) >= 3, spec.name
        for proposal in seeds:
            args = resolve(proposal.plan, spec).args
            errors = [e for e in check_source(proposal.source, proposal.plan.entry, args=args) if e.severity == "error"]
            assert not errors, (spec.name, proposal.params, errors)


def test_the_elementwise_scalar_is_read_once_and_the_split_layout_needs_vectors_that_divide_h() -> None:
    scalar = _card("matrix_scalar_mul")
    source, plan = _template(scalar).render(
        scalar, typed(_template(scalar), scalar, TemplateProposer().seeds(scalar)[0].params)
    )
    assert plan.args == ["A", "s", "B", "(side) * (side):i64"]
    assert source.count("s[0]") == 1 and source.index("s[0]") < source.index("for (long long base")

    merged = _card("silu_and_mul", sizes=lambda scale: {"tokens": 5, "hidden": 102})
    template = _template(merged)
    base = {"vec": 2, "block": 256, "unroll": 1, "loop": "grid_stride", "waves": 4, "minb": 1}
    assert template.problem(merged, typed(template, merged, base)) is None
    assert "does not divide the half row h = 102" in str(
        template.problem(merged, typed(template, merged, {**base, "vec": 4}))
    )
    assert template.render(merged, typed(template, merged, base))[1].args == [
        "x",
        "y",
        "(tokens) * (hidden):i64",
        "hidden",
    ]


def test_the_elementwise_template_refuses_shapes_its_layouts_cannot_read() -> None:
    wide = _card("silu_and_mul", inputs=(Tensor("x", ("tokens", "3 * hidden")),))
    assert "takes x [..., 2 h] for an output [..., h]" in str(ElementwiseTemplate().unsupported(wide))
    pair = _card("matrix_scalar_mul", inputs=(Tensor("A", ("side", "side")), Tensor("s", (2,))))
    assert "or be one element (a scalar)" in str(ElementwiseTemplate().unsupported(pair))
    assert template_for(wide) is None and template_for(pair) is None


def test_the_point_reduction_loads_whole_points_and_the_row_reduction_fits_its_threads_to_the_row() -> None:
    mc = _card("monte_carlo_integration")
    reduction = _template(mc)
    base = {"blocks": 1, "block": 256, "vec": 4, "unroll": 1}
    assert reduction.problem(mc, typed(reduction, mc, base)) is None
    for vec in (1, 2):
        assert "does not hold whole points of 4" in str(
            reduction.problem(mc, typed(reduction, mc, {**base, "vec": vec}))
        )
    source, plan = reduction.render(mc, typed(reduction, mc, base))
    assert plan.args == ["points", "estimate", "(n):i64"] and "total / (float)n" in source
    five = _card("monte_carlo_integration", sizes=lambda scale: {"n": 256, "d": 5})
    assert "a point of 5 coordinates does not fit a 16-byte load" in str(reduction.unsupported(five))

    short = _card("simpson_integration", sizes=lambda scale: {"rows": 64, "m": 16})
    rows = _template(short)
    assert rows.problem(short, typed(rows, short, {"tpr": 16, "block": 64, "unroll": 1})) is None
    assert "exceed its 17 elements" in str(
        rows.problem(short, typed(rows, short, {"tpr": 32, "block": 64, "unroll": 1}))
    )
    assert "exceed the block of 64" in str(
        rows.problem(short, typed(rows, short, {"tpr": 128, "block": 64, "unroll": 1}))
    )
    assert "reduces each row" in str(ReductionTemplate().unsupported(short))
    assert "reduces everything" in str(RowReductionTemplate().unsupported(mc))
    assert (
        "/ (3.0f * (float)(cols - 1))"
        in rows.render(short, typed(rows, short, {"tpr": 16, "block": 64, "unroll": 1}))[0]
    )


def test_the_gemv_template_refuses_params_that_do_not_fit_k() -> None:
    card = _card("matrix_vector_mul", "bfloat16", sizes=lambda scale: {"M": 32, "K": 36})
    gemv = _template(card)
    base = {"tpr": 4, "block": 128, "vec": 4, "unroll": 2}
    assert gemv.problem(card, typed(gemv, card, base)) is None
    assert gemv.problem(card, typed(gemv, card, {**base, "vec": 8})) == "vec 8 does not divide K = 36"
    assert gemv.problem(card, typed(gemv, card, {**base, "tpr": 16})) == "16 threads per row exceed its 9 chunks"
    deep = {**base, "vec": 8, "unroll": 4}
    assert (
        gemv.problem(_card("matrix_vector_mul", "bfloat16"), typed(gemv, _card("matrix_vector_mul", "bfloat16"), deep))
        == "64 loaded floats per thread (at most 32)"
    )
    assert gemv.render(card, typed(gemv, card, base))[1].args == ["A", "x", "y", "M", "K"]


def test_the_max_pooling_mode_needs_whole_output_chunks_in_a_row_and_2x2_windows() -> None:
    odd = _card("max_pooling_2d", "bfloat16", sizes=lambda scale: {"n": 2, "c": 8, "h": 12, "w": 12})
    pooling = _template(odd)
    assert pooling.space(odd)["ow"] == (1, 2, 4)
    assert pooling.problem(odd, typed(pooling, odd, {"ow": 2, "block": 128, "unroll": 1})) is None
    assert (
        pooling.problem(odd, typed(pooling, odd, {"ow": 4, "block": 128, "unroll": 1}))
        == "ow 4 does not divide w/2 = 6"
    )
    assert _template(_card("max_pooling_2d")).space(_card("max_pooling_2d"))["ow"] == (1, 2), "16-byte loads"
    to_one = _card("max_pooling_2d", outputs=(Tensor("y", ("n", "c")),))
    assert "2x2 windows with stride 2" in str(PoolingTemplate().unsupported(to_one)), "a max is never averaged"
    source, plan = pooling.render(odd, typed(pooling, odd, {"ow": 2, "block": 128, "unroll": 1}))
    assert plan.entry == "kf_max_pool" and plan.args == ["x", "y", "n * c * (h / 2) * (w / 2) / 2:i64", "w / 2 / 2"]
    assert "(v > m || v != v) ? v : m" in source and "fmaxf" not in source, "NaN propagates"


def test_one_seed_of_each_new_mode_builds_with_nvcc(tmp_path: Path, cubin_cache: Path) -> None:
    """The scalar and split elementwise layouts, point terms (a cluster seed), the row reduction, gemv, 2x2 max."""
    picks = [
        ("matrix_scalar_mul", "bfloat16"),
        ("silu_and_mul", "bfloat16"),
        ("monte_carlo_integration", "float32"),
        ("simpson_integration", "bfloat16"),
        ("matrix_vector_mul", "float32"),
        ("max_pooling_2d", "bfloat16"),
    ]
    builder = Builder(arch="sm_90", flags=("-O3",), cache_dir=cubin_cache, work_dir=tmp_path)
    jobs = [(card := _card(name, precision), TemplateProposer().seeds(card)[0]) for name, precision in picks]

    async def build_all() -> list[str]:
        results = await asyncio.gather(
            *(builder.build(p.source, p.plan.entry, resolve(p.plan, card).args) for card, p in jobs)
        )
        problems = []
        for (card, p), result in zip(jobs, results, strict=True):
            stats = result.ptxas.get(p.plan.entry) if result.ok else None
            if not result.ok or stats is None or stats.spill_store_bytes:
                problems.append(f"{card.name} {p.params}: {result.log[-1500:]} {stats}")
        return problems

    assert asyncio.run(build_all()) == []
