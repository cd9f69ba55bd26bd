"""The chain templates (proposers/templates/chains.py) on the CPU emulator (tests/support/cuda_emulator.py): every seed
of every chain card of tests/support/fixtures/chains_model.py, stream_model.py (the residual streams of Llama and
ViT: chains that write the residual sum too) and bottleneck_model.py (ResNet's batch norms, NCHW and channels-last),
captured in fp32 and bf16 at sizes that reach the
block-wide reductions, against the card's own reference (the captured calls replayed) on its stored, seeded and every
stress set; which template serves which card; and a seed of each template built with nvcc (ptxas: no spills). On the
H200 (`pytest -m gpu`), every seed of every card through the GPU worker's checks."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.capture import load_capture
from kernelforge_tui.cards import Card, load_card, resolve
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.chains import (
    BatchNormActTemplate,
    BiasActTemplate,
    ChainRowTemplate,
    GroupNormActTemplate,
)
from kernelforge_tui.proposers.templates.common import Params
from tests.gpu.test_stress import failing_seeds
from tests.proposers.templates.test_emulation import INTRINSICS, namespace, wrong_outputs
from tests.support.cuda_emulator import build, emulation_source

if not os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    pytest.importorskip("torch", reason="the chain cards are captured with torch (CI installs it: .ci/run)")

from kernelforge_tui.capture.run import CaptureRequest, capture_model

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker
FIXTURES = Path(__file__).parents[2] / "support" / "fixtures"
MODELS: list[tuple[Path, dict[str, Any], str]] = [
    (FIXTURES / "chains_model.py", {"dim": 256, "seq": 64, "side": 16}, ""),
    (FIXTURES / "stream_model.py", {"dim": 256}, ""),
    (FIXTURES / "bottleneck_model.py", {"side": 16}, ""),
    (FIXTURES / "bottleneck_model.py", {"side": 16, "channels_last": True}, "-channels-last"),
]
"""(model, its build's sizes, the suffix of its cards' keys): rows of 256 (x + r, norms: up to 64 threads a row at
vec 4), softmax rows of 64 over [2, 2, 64, 64] with a [64, 64] mask, groups of 2 x 16 x 16 elements; the residual
streams (Llama's, ViT's) with rows of 256; ResNet's bottleneck at 16 x 16 in NCHW and channels-last (8 and 32
channels)."""
SERVED = {
    "residual_layer_norm": ChainRowTemplate,
    "residual_rms_norm": ChainRowTemplate,
    "residual_sum_layer_norm": ChainRowTemplate,
    "residual_sum_rms_norm": ChainRowTemplate,
    "batch_norm_relu": BatchNormActTemplate,
    "batch_norm_add_relu": BatchNormActTemplate,
    "batch_norm_relu-channels-last": BatchNormActTemplate,
    "batch_norm_add_relu-channels-last": BatchNormActTemplate,
    "scale_mask_softmax": ChainRowTemplate,
    "bias_gelu": BiasActTemplate,
    "group_norm_silu": GroupNormActTemplate,
}
DTYPES = ("float32", "bfloat16")

Emulated = tuple[Path, dict[tuple[str, str], tuple[Card, list[Params]]]]


@pytest.fixture(scope="module")
def chain_cards(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Card]:
    """The chain cards of the fixture models captured (on the CPU) in each dtype, by (pattern, dtype)."""
    work = tmp_path_factory.mktemp("chain-cards")
    cards: dict[tuple[str, str], Card] = {}
    for (model, sizes, suffix), dtype in itertools.product(MODELS, DTYPES):
        out = work / f"{model.stem}{suffix}-{dtype}.capture"
        request = CaptureRequest(model, out, device="cpu", repeats=1, samples=1, kwargs={"dtype": dtype, **sizes})
        capture_model(request)
        for variant in load_capture(out).variants:
            if variant.kind == "pattern" and variant.op + suffix in SERVED and variant.card is not None:
                cards.setdefault((variant.op + suffix, dtype), load_card(out / variant.card))
    return cards


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory, chain_cards: dict[tuple[str, str], Card]) -> Iterator[Emulated]:
    """The chain cards with their seeds, built into one emulator program per card."""
    work = tmp_path_factory.mktemp("chain-emulator")
    chosen = {
        key: (card, [seed.params for seed in TemplateProposer().seeds(card.spec)]) for key, card in chain_cards.items()
    }
    programs = {  # by key: a card's name is its shape's, the same in both layouts
        "-".join(key): emulation_source([namespace(i, card, p) for i, p in enumerate(seeds)], prelude=INTRINSICS)
        for key, (card, seeds) in chosen.items()
    }
    build(work, programs)
    yield work, chosen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern", SERVED)
def test_every_chain_seed_matches_the_cards_reference_on_every_set(
    emulated: Emulated, pattern: str, dtype: str
) -> None:
    work, chosen = emulated
    card, seeds = chosen[pattern, dtype]
    assert isinstance(template_for(card.spec), SERVED[pattern]) and len(seeds) >= 4
    assert any(name.startswith("stress:") for name, _, _ in card.stress_sets())
    assert wrong_outputs(work, card, seeds, f"{pattern}-{dtype}") == []


def test_the_rounded_chains_are_among_those_checked(emulated: Emulated) -> None:
    """The chains' references keep each intermediate result in its dtype, as eager does (bf16 residual_layer_norm and
    bias_gelu would not agree with eager otherwise): their kernels round where the reference does, and the emulator
    checks those renders."""
    _, chosen = emulated
    rounded = {key for key, (card, _) in chosen.items() if card.spec.chain is not None and card.spec.chain.rounded}
    assert set(chosen) == rounded  # every chain's reference is stepwise: each call's result in its dtype
    source = TemplateProposer().seeds(chosen["bias_gelu", "bfloat16"][0].spec)[0].source
    assert "to_f(from_f(in[u][j] + bias[u][j]))" in source


def test_a_chain_card_is_never_served_by_a_single_ops_template(emulated: Emulated) -> None:
    """The scaled softmax's x -> y and the group norm's x, gamma, beta -> y follow the softmax and group norm
    templates' naming: they would compute one call of the chain."""
    _, chosen = emulated
    for (pattern, _), (card, _) in chosen.items():
        template = template_for(card.spec)
        assert template is not None, pattern
        assert template.name in ("chain_rows", "bias_act", "batch_norm_act", "group_norm_act"), pattern
    for card, _ in chosen.values():
        unchained = card.spec.model_copy(update={"chain": None})
        chain_templates = (ChainRowTemplate, BiasActTemplate, BatchNormActTemplate, GroupNormActTemplate)
        assert not isinstance(template_for(unchained), chain_templates)


def test_a_seed_of_each_chain_template_builds_with_nvcc(emulated: Emulated, sm90_builder: Builder) -> None:
    """One bf16 seed per template, and the two-output rows chain (five builds): the sources nvcc takes, without
    spills."""
    _, chosen = emulated
    jobs = []
    for pattern in (
        "residual_layer_norm",
        "residual_sum_rms_norm",
        "bias_gelu",
        "batch_norm_add_relu",
        "group_norm_silu",
    ):
        card = chosen[pattern, "bfloat16"][0].spec
        jobs.append((card, TemplateProposer().seeds(card)[0]))

    async def build_all() -> list[str]:
        results = await asyncio.gather(
            *(sm90_builder.build(p.source, p.plan.entry, resolve(p.plan, card).args) for card, p in jobs)
        )
        problems = []
        for (card, p), result in zip(jobs, results, strict=True):
            stats = result.ptxas.get(p.plan.entry) if result.ok else None
            if not result.ok or stats is None or stats.spill_store_bytes:
                problems.append(f"{card.name} {p.params}: {result.log[-1500:]} {stats}")
        return problems

    assert asyncio.run(build_all()) == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern", SERVED)
def test_every_chain_seed_passes_every_set_on_the_gpu(
    loop: asyncio.AbstractEventLoop, chain_cards: dict[tuple[str, str], Card], pattern: str, dtype: str
) -> None:
    """The emulator's check on the H200 (`pytest -m gpu`): the GPU's own intrinsics and rounding, the worker's
    checks of every set (stored, fresh, every stress set)."""
    assert loop.run_until_complete(failing_seeds(chain_cards[pattern, dtype])) == []
