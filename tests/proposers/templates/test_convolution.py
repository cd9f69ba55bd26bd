"""The direct convolution template (proposers/templates/convolution.py): which cards it serves and why not the others,
its rules, and its kernels on the CPU emulator (tests/support/cuda_emulator.py) against the suite's float64
reference on the seeded and every stress set: every seed of conv_1d and conv_2d in both precisions, and variants
that stage the input channels in several steps on planes no tile divides (partial tiles at both edges)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import Card, save_card
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.proposers.templates.convolution import ConvolutionTemplate
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Precision
from tests.conftest import canonical, typed
from tests.proposers.templates.test_emulation import namespace, wrong_outputs
from tests.support.cuda_emulator import build, emulation_source
from tests.support.seed_builds import build_problems

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

TEMPLATE = ConvolutionTemplate()
PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16")
ODD = {
    "conv_1d": {"n": 2, "ci": 8, "co": 8, "l": 300, "k": 7},
    "conv_2d": {"n": 1, "ci": 8, "co": 8, "h": 19, "w": 36, "k": 3},
}
"""Planes no tile divides: 300 = 256 + 44 samples, 19 x 36 (4-element chunks; tiles of 16 and 32 columns overhang)."""
STEPPED: Params = {"pw": 2, "layout": "blocked", "cob": 4, "cpt": 2, "cib": 2, "minb": 1}
"""Two channels staged a step (four steps over ci = 8), half the output channels a block (two channel groups)."""


def suite_card(name: str, precision: Precision, scale: int = 2**14) -> OperatorCard:
    return suite_cards.spec(task(name), precision, scale)


def odd_card(name: str, precision: Precision, parent: Path) -> Card:
    """The suite's card written with the sizes of ODD (its reference takes any sizes)."""
    written = suite_cards.write(task(name), precision, 2**10, parent / f"{name}_{precision}_odd")
    spec = written.spec.model_copy(update={"sizes": ODD[name], "name": f"{name}_{precision}_odd"})
    return save_card(spec, written.root, {})


def test_the_suite_convolutions_are_served_and_captured_ones_are_told_why() -> None:
    for name in ("conv_1d", "conv_2d"):
        for precision in PRECISIONS:
            assert isinstance(template_for(suite_card(name, precision)), ConvolutionTemplate)
    spec = suite_card("conv_2d", "float32")
    captured = spec.model_copy(update={"sizes": {"n": 2, "c": 8, "o": 8, "h": 32, "w": 32, "kh": 3, "kw": 3}})
    assert "card lacks sizes ['ci', 'co', 'k']" in str(TEMPLATE.unsupported(captured))
    even = spec.model_copy(update={"sizes": {**spec.sizes, "k": 4}})
    assert "needs an odd k" in str(TEMPLATE.unsupported(even))


def test_the_rules() -> None:
    spec = suite_card("conv_2d", "float32")  # 2 x 8 x 32 x 32, 3 x 3 taps
    seed = TemplateProposer().seeds(spec)[0].params
    assert TEMPLATE.space(suite_card("conv_1d", "float32"))["th"] == (1,)
    assert canonical(TEMPLATE, spec, {**seed, "pw": 1, "layout": "blocked"}) == {**seed, "pw": 1, "layout": "strided"}
    problems = {
        "cib 3 does not divide 8": {"cib": 3},
        "vec 4 does not divide 2": {"tw": 2, "pw": 1},
        "tw 64 exceeds 32 by more than a smaller tile would": {"tw": 64},
        "4 threads per block, outside 32..1024": {"tw": 16, "th": 1, "pw": 4},
        "128 accumulators per thread": {"tw": 32, "th": 16, "pw": 16, "cpt": 8},
    }
    for message, change in problems.items():
        assert message in str(TEMPLATE.problem(spec, typed(TEMPLATE, spec, {**seed, **change}))), change
    wide = spec.model_copy(update={"sizes": {**spec.sizes, "ci": 16, "co": 16, "h": 256, "w": 256}})
    staged = typed(TEMPLATE, wide, {**seed, "tw": 256, "th": 16, "pw": 8, "cob": 16, "cpt": 8, "cib": 16})
    assert "bytes of shared tiles exceed" in str(TEMPLATE.problem(wide, staged))


def cases(parent: Path) -> Iterator[tuple[str, Card, list[Params]]]:
    """(program, card, params): each suite card with its seeds, each odd one with a seed, STEPPED and the textbook."""
    for name in ("conv_1d", "conv_2d"):
        for precision in PRECISIONS:
            card = suite_cards.write(task(name), precision, 2**14, parent / "cards")
            yield card.spec.name, card, [p.params for p in TemplateProposer().seeds(card.spec)]
            odd = odd_card(name, precision, parent / "cards")
            seeds = [p.params for p in TemplateProposer().seeds(odd.spec)]
            variants = [seeds[0], {**seeds[0], **STEPPED}, seeds[-1]]
            assert all(TEMPLATE.valid(odd.spec, v) is not None for v in variants), variants
            yield odd.spec.name, odd, variants


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, Card, list[Params]]]]:
    work = tmp_path_factory.mktemp("convolution-emulator")
    chosen = list(cases(work))
    build(work, {name: emulation_source([namespace(i, card, p) for i, p in enumerate(params)])
                 for name, card, params in chosen})  # fmt: skip
    return work, chosen


def test_every_convolution_kernel_matches_the_reference_on_every_set(
    emulated: tuple[Path, list[tuple[str, Card, list[Params]]]],
) -> None:
    work, chosen = emulated
    assert len(chosen) == 8
    for _, card, params in chosen:
        assert {name for name, _, _ in card.stress_sets()} == {"stress:nan-inf", "stress:tiny"}
        assert wrong_outputs(work, card, params) == [], card.spec.name


def test_the_seeds_build_without_spills(sm90_builder: Builder) -> None:
    """The first two seeds of the largest conv_1d and conv_2d cards, in both precisions (sizes are compile-time
    constants, so these are the bench's own kernels)."""
    chosen = [
        (spec, proposal)
        for name in ("conv_1d", "conv_2d")
        for precision in PRECISIONS
        for spec in [suite_card(name, precision, 2**22)]
        for proposal in TemplateProposer().seeds(spec)[:2]
    ]

    assert len(chosen) == 8
    assert build_problems(sm90_builder, chosen) == []
