"""Golden renders: the sha256 of every template seed's source and plan, and of a fixed-seed sample of each template's
space, on the suite's cards (smallest and largest scale, every precision) and two group norm cards.

Why: a template candidate's source is what the GPU runs, so a change to a render must be a reviewed change, never a
side effect of moving text around. Updating the digests: tests/support/golden_digests.py.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from bench.attention_mma import CASES as ATTENTION_CASES
from bench.attention_mma import card_of as attention_card
from bench.conv_cutlass import CASES as CONV_CASES
from bench.conv_cutlass import card_of as conv_card
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.proposers.templates import TEMPLATES, TemplateProposer, template_for
from kernelforge_tui.proposers.templates.common import Params, Template, TemplateParams
from kernelforge_tui.proposers.templates.conv_igemm import ConvIgemmTemplate
from kernelforge_tui.proposers.templates.gemm_sm90 import GemmSm90Template
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import TASKS
from tests.support.chain_cards import chain_cards
from tests.support.cutlass_marks import needs_cutlass
from tests.support.golden_digests import assert_matches_golden, sha256

SAMPLES = 24
"""Sampled configurations per template, beyond the seeds, spread over its cards."""
DRAWS = 400
"""Random draws tried per sample before giving up on it (most of a space may be invalid for a card)."""


def _group_norm_card(name: str, dtype: str, sizes: dict[str, int], stats: bool) -> OperatorCard:
    nchw = ["n", "c", "h", "w"]
    stat = [{"name": k, "dtype": dtype, "shape": ["n", "groups"]} for k in ("mean", "rstd")] * stats
    return OperatorCard.model_validate(
        {
            "name": name,
            "family": "group_norm",
            "sizes": sizes,
            "inputs": [
                {"name": "x", "dtype": dtype, "shape": nchw},
                {"name": "gamma", "dtype": dtype, "shape": ["c"]},
                {"name": "beta", "dtype": dtype, "shape": ["c"]},
            ],
            "outputs": [{"name": "y", "dtype": dtype, "shape": nchw}, *stat],
            "input_sets": [{"name": "s", "seed": 1}],
            "reference": {"function": "group_norm"},
        }
    )


def _avg_pool_card(name: str, dtype: str, sizes: dict[str, int]) -> OperatorCard:
    return OperatorCard.model_validate(
        {
            "name": name,
            "family": "pooling",
            "sizes": sizes,
            "inputs": [{"name": "x", "dtype": dtype, "shape": ["n", "c", "h", "w"]}],
            "outputs": [{"name": "y", "dtype": dtype, "shape": ["n", "c"]}],
            "input_sets": [{"name": "s", "seed": 1}],
            "reference": {"function": "adaptive_avg_pool"},
        }
    )


def _gemm_card(name: str, dtype: str, sizes: dict[str, int], b: list[str], bias: bool) -> OperatorCard:
    """A captured matrix product's card (capture/families.py): a [(batch,) M, K], b in its captured layout."""
    lead = ["batch"] if "batch" in sizes else []
    inputs = [
        {"name": "a", "dtype": dtype, "shape": [*lead, "M", "K"]},
        {"name": "b", "dtype": dtype, "shape": [*lead, *b]},
    ]
    return OperatorCard.model_validate(
        {
            "name": name,
            "family": "matmul",
            "sizes": sizes,
            "inputs": inputs + [{"name": "bias", "dtype": dtype, "shape": ["N"]}] * bias,
            "outputs": [{"name": "y", "dtype": dtype, "shape": [*lead, "M", "N"]}],
            "input_sets": [{"name": "s", "seed": 1}],
            "reference": {"kind": "numpy", "function": "reference.py:reference"},
        }
    )


def golden_cards() -> Iterator[OperatorCard]:
    """Every card a template serves among the suite's (both ends of each task's scales), and cards of the modes the
    suite lacks: group norm (with and without its statistics), average pooling, captured matrix products,
    convolutions and attention, and fused chains."""
    for case in TASKS.values():
        for precision in case.precisions:
            for scale in dict.fromkeys((case.scales[0], case.scales[-1])):
                yield suite_cards.spec(case, precision, scale)
    yield _group_norm_card("group_norm_bf16_8x512x128x128", "bfloat16",
                           {"n": 8, "c": 512, "h": 128, "w": 128, "groups": 32}, stats=False)  # fmt: skip
    yield _group_norm_card("group_norm_stats_f32_2x64x9x9", "float32",
                           {"n": 2, "c": 64, "h": 9, "w": 9, "groups": 8}, stats=True)  # fmt: skip
    yield _avg_pool_card("avg_pool_bf16_256x2048x7x7", "bfloat16", {"n": 256, "c": 2048, "h": 7, "w": 7})
    yield _avg_pool_card("avg_pool_f32_3x5x6x6", "float32", {"n": 3, "c": 5, "h": 6, "w": 6})
    yield _gemm_card("linear_gelu_bf16_2048x2048", "bfloat16", {"M": 2048, "N": 5632, "K": 2048}, ["N", "K"], True)
    yield _gemm_card(
        "bmm_f16_32x1024x1024", "float16", {"batch": 32, "M": 1024, "N": 128, "K": 1024}, ["K", "N"], False
    )
    yield from (
        conv_card(case)
        for case in CONV_CASES
        if case["name"] in ("diffusion_3x3", "resnet_s1_3x3", "resnet_s2_3x3_stride2", "tails")
    )
    yield from (attention_card(case) for case in ATTENTION_CASES if case["name"] in ("llama", "vit"))
    yield from chain_cards()


CUTLASS_TEMPLATES = (GemmSm90Template, ConvIgemmTemplate)
"""Those whose renders need the CUTLASS headers (their version is in the source)."""


def _key(card: OperatorCard, params: Params) -> str:
    return f"{card.name} {json.dumps(params, sort_keys=True, separators=(',', ':'))}"


def _digests(template: Template[Any], card: OperatorCard, params: TemplateParams) -> str:
    """`<sha256 of the source> <sha256 of the plan's JSON>`: one line a render in the JSON."""
    source, plan = template.render(card, params)
    return f"{sha256(source)} {sha256(plan.model_dump_json())}"


def renders(template: Template[Any]) -> dict[str, str]:
    """The template's seeds on each of its cards, then SAMPLES valid configurations drawn round-robin over its cards
    by a generator seeded with the template's name."""
    served = [card for card in golden_cards() if template_for(card) is template]
    assert served, f"no golden card for {type(template).__name__}"
    chosen: dict[str, tuple[OperatorCard, TemplateParams]] = {}
    for card in served:
        for seed in TemplateProposer().seeds(card):
            chosen.setdefault(_key(card, seed.params), (card, template.valid(card, seed.params)))
    rng = random.Random(f"golden:{type(template).__name__}")
    for index in range(SAMPLES):
        card = served[index % len(served)]
        space = template.space(card)
        for _ in range(DRAWS):
            params = template.valid(card, {k: rng.choice(values) for k, values in space.items()})
            if params is not None and _key(card, params.as_dict()) not in chosen:
                chosen[_key(card, params.as_dict())] = (card, params)
                break
    return {key: _digests(template, card, params) for key, (card, params) in sorted(chosen.items())}


@pytest.mark.parametrize(
    "template",
    [pytest.param(t, marks=needs_cutlass) if isinstance(t, CUTLASS_TEMPLATES) else t for t in TEMPLATES],
    ids=lambda t: type(t).__name__,
)
def test_every_render_matches_its_golden_digest(template: Template[Any]) -> None:
    """A render that changes must come with a new version of its template (see golden_digests.py)."""
    assert_matches_golden("template_renders.json", type(template).__name__, renders(template), template.version)
