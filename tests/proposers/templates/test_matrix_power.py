"""The matrix power template (proposers/templates/matrix_power.py) on the suite's matrix_power, C = A^4 with fp32
intermediates: which cards it serves, its rules, every seed on the CPU emulator (tests/support/cuda_emulator.py)
against the suite's float64 power on the seeded sets (n = 32 and 128, both precisions: the sets' inputs are the
task's generator's, entries of variance 1/n), and the seeds of the 2^22 cards built with nvcc (no spills)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import Card
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.proposers.templates.matrix_power import MatrixPowerTemplate
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Precision
from tests.conftest import typed
from tests.proposers.templates.test_contraction import GRID_2D, namespace, wrong_on_seeded_sets
from tests.support.cuda_emulator import build, emulation_source
from tests.support.seed_builds import build_problems

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16")
TEMPLATE = MatrixPowerTemplate()


def test_the_suite_card_is_served_and_says_its_power() -> None:
    spec = suite_cards.spec(task("matrix_power"), "float32", 2**22)
    assert spec.sizes == {"n": 2048, "power": 4}
    assert isinstance(template_for(spec), MatrixPowerTemplate)
    seed = TemplateProposer().seeds(spec)[0]
    assert seed.plan.args == ["A", "C"] and seed.plan.shared_bytes == 2 * 8 * 2048 * 4, "8 rows, two fp32 copies"
    assert "#define POWER 4" in seed.source
    unknown = spec.model_copy(update={"sizes": {"n": 2048}})
    assert "card lacks sizes ['power']" in str(TEMPLATE.unsupported(unknown))
    params = typed(TEMPLATE, spec, {**seed.params, "bm": 16})
    assert "bytes of chained rows" in str(TEMPLATE.problem(spec, params))
    assert "threads per block" in str(
        TEMPLATE.problem(spec, typed(TEMPLATE, spec, {**seed.params, "bn": 128, "tn": 8, "tm": 8}))
    )


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[Card, list[Params]]]]:
    work = tmp_path_factory.mktemp("matrix-power-emulator")
    chosen = []
    for precision in PRECISIONS:
        for scale in (2**10, 2**14):
            card = suite_cards.write(task("matrix_power"), precision, scale, work / "cards")
            chosen.append((card, [p.params for p in TemplateProposer().seeds(card.spec)]))
    build(work, {card.spec.name: emulation_source([namespace(i, card, p) for i, p in enumerate(seeds)],
                                                  prelude=GRID_2D) for card, seeds in chosen})  # fmt: skip
    return work, chosen


def test_every_matrix_power_seed_matches_the_reference_on_the_seeded_sets(
    emulated: tuple[Path, list[tuple[Card, list[Params]]]],
) -> None:
    work, chosen = emulated
    for card, seeds in chosen:
        assert len(seeds) >= 3
        assert wrong_on_seeded_sets(work, card, seeds) == []


def test_the_seeds_build_without_spills(sm90_builder: Builder) -> None:
    chosen = [
        (spec, proposal)
        for precision in PRECISIONS
        for spec in [suite_cards.spec(task("matrix_power"), precision, 2**22)]
        for proposal in TemplateProposer().seeds(spec)
    ]

    assert build_problems(sm90_builder, chosen) == []
