"""The flash-style attention template (proposers/templates/attention.py) on the suite's softmax_attention and
triangle_attention: which cards it serves, its rules, every seed on the CPU emulator (tests/support/cuda_emulator.py)
against the suite's float64 reference on the seeded and every stress set (both precisions; __expf is exact there:
its few ulp are the GPU's to check), and the first two seeds of the 2^22 cards built with
nvcc (no spills)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import Card
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.attention import AttentionTemplate
from kernelforge_tui.proposers.templates.attention_mma import AttentionMmaTemplate
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Precision
from tests.conftest import typed
from tests.proposers.templates.test_emulation import INTRINSICS, namespace, wrong_outputs
from tests.support.cuda_emulator import build, emulation_source
from tests.support.seed_builds import build_problems

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16")
TASKS = ("softmax_attention", "triangle_attention")
TEMPLATE = AttentionTemplate()


def test_the_suite_attention_cards_are_served_and_the_rules() -> None:
    for name in TASKS:
        for precision in PRECISIONS:
            served = template_for(suite_cards.spec(task(name), precision, 2**14))
            tensor_cores = (name, precision) == ("softmax_attention", "bfloat16")  # attention_mma's (its own tests)
            assert isinstance(served, AttentionMmaTemplate if tensor_cores else AttentionTemplate), (name, precision)
    spec = suite_cards.spec(task("softmax_attention"), "float32", 2**14)  # 4 heads of 64 rows, d = 64
    seed = TemplateProposer().seeds(spec)[0]
    assert seed.plan.args == ["q", "k", "v", "o"] and "bias" not in seed.source
    triangle = suite_cards.spec(task("triangle_attention"), "float32", 2**14)
    assert TemplateProposer().seeds(triangle)[0].plan.args == ["q", "k", "v", "bias", "o"]
    batched = spec.model_copy(update={"inputs": [t.model_copy(update={"shape": ["heads", "d", "seq"]})
                                                 for t in spec.inputs]})  # fmt: skip
    assert "the suite's attention layouts" in str(TEMPLATE.unsupported(batched))
    problems = {
        "bq 128 does not divide 64": {"bq": 128},
        "threads per block: whole warps": {"bq": 4, "tpr": 4},
        "bkv 64 does not divide 16": {"bq": 16, "bkv": 64},
    }
    for message, change in problems.items():
        card = triangle if "16" in message else spec
        assert message in str(TEMPLATE.problem(card, typed(TEMPLATE, card, {**seed.params, **change}))), change


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[Card, list[Params]]]]:
    """Each task's 2^14 card (4 heads of 64 rows; 16 x 16 pairs of 4 heads, c = 32) with its seeds."""
    work = tmp_path_factory.mktemp("attention-emulator")
    chosen = []
    for name in TASKS:
        for precision in PRECISIONS:
            card = suite_cards.write(task(name), precision, 2**14, work / "cards")
            chosen.append((card, [p.params for p in TemplateProposer().seeds(card.spec)]))
    programs = {
        card.spec.name: emulation_source([namespace(i, card, p) for i, p in enumerate(seeds)], prelude=INTRINSICS)
        for card, seeds in chosen
    }
    build(work, programs)
    return work, chosen


def test_every_attention_seed_matches_the_reference_on_every_set(
    emulated: tuple[Path, list[tuple[Card, list[Params]]]],
) -> None:
    work, chosen = emulated
    for card, seeds in chosen:
        assert len(seeds) >= 3
        assert wrong_outputs(work, card, seeds) == [], card.spec.name


def test_the_seeds_build_without_spills(sm90_builder: Builder) -> None:
    chosen = [
        (spec, proposal)
        for name in TASKS
        for precision in PRECISIONS
        for spec in [suite_cards.spec(task(name), precision, 2**22)]
        for proposal in TemplateProposer().seeds(spec)[:2]
    ]

    assert build_problems(sm90_builder, chosen) == []
