"""The tensor-core attention template (proposers/templates/attention_mma.py) on captured attention cards: which it
serves and why not the others, how a render reads the card's layouts and call, and its kernels on the CPU emulator
(tests/support/cuda_emulator.py: ldmatrix and mma.sync over the PTX ISA's fragment layouts) against the captured
calls' own outputs and the cards' stress sets: causal and not, a [batch, seq, heads, dim] projection read in place,
query and key counts no tile divides. Builds for sm_90 without spills; the H200 runs are owed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.capture import load_capture
from kernelforge_tui.cards import Card, load_card
from kernelforge_tui.proposers.base import Proposal
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.attention_mma import AttentionMmaParams, AttentionMmaTemplate
from tests.proposers.templates.test_emulation import namespace, wrong_outputs
from tests.support.cuda_emulator import build, emulation_source
from tests.support.seed_builds import build_problems

if os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    import torch  # noqa: F401
else:
    pytest.importorskip("torch", reason="capture needs torch (CI installs it: .ci/run)")

from kernelforge_tui.capture.run import CaptureRequest, capture_model

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture captures and builds once, on one worker
TEMPLATE = AttentionMmaTemplate()
MODEL = """
import torch
import torch.nn.functional as F
from torch import nn


class Attend(nn.Module):
    def forward(self, q, k, v, q2, k2, v2):
        seq_first = lambda t: t.transpose(1, 2)  # [batch, seq, heads, dim] seen as [batch, heads, seq, dim]
        return (
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(seq_first(q2), seq_first(k2), seq_first(v2), scale=0.3),
        )


def build(device="cpu", dtype="bfloat16"):
    torch.manual_seed(0)
    t = getattr(torch, dtype)
    make = lambda *shape: torch.randn(*shape, device=device, dtype=t)
    # 80 queries: a block of 64 and a tail; 72 keys: a tile of 64 and a tail (and 40 causal queries past them)
    return Attend().eval(), (make(1, 2, 80, 64), make(1, 2, 80, 64), make(1, 2, 80, 64),
                             make(2, 40, 2, 64), make(2, 72, 2, 64), make(2, 72, 2, 64))
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Card]]:
    root = tmp_path_factory.mktemp("attention")
    (root / "attend.py").write_text(MODEL)
    out = root / "attend.capture"
    capture_model(CaptureRequest(root / "attend.py", out, device="cpu", repeats=1, samples=1))
    cards = [load_card(out / str(v.card)) for v in load_capture(out).variants if v.family == "attention"]
    assert len(cards) == 2
    return root, cards


def test_captured_cards_are_served_and_the_others_told_why(captured: tuple[Path, list[Card]]) -> None:
    _, cards = captured
    for card in cards:
        assert isinstance(template_for(card.spec), AttentionMmaTemplate), TEMPLATE.unsupported(card.spec)
    spec = cards[0].spec
    fp32 = spec.model_copy(
        update={
            "inputs": [t.model_copy(update={"dtype": "float32"}) for t in spec.inputs],
            "outputs": [t.model_copy(update={"dtype": "float32"}) for t in spec.outputs],
        }
    )
    assert "tensor cores take one of ['bfloat16', 'float16']" in str(TEMPLATE.unsupported(fp32))
    wide = spec.model_copy(update={"sizes": {**spec.sizes, "d": 96, "dv": 96}})
    assert "d = dv, one of [64, 128]" in str(TEMPLATE.unsupported(wide))
    inner = [t.model_copy(update={"shape": ["batch", "heads", "d", "sq"]}) if t.name == "q" else t for t in spec.inputs]
    assert "reads rows of d contiguous elements" in str(TEMPLATE.unsupported(spec.model_copy(update={"inputs": inner})))
    assert "records no" in str(TEMPLATE.unsupported(spec.model_copy(update={"call": None})))


def test_a_render_reads_the_layouts_and_the_call(captured: tuple[Path, list[Card]]) -> None:
    _, cards = captured
    by_causal = {
        "CAUSAL 1" in TEMPLATE.render(c.spec, AttentionMmaParams(warps=4, bkv=64, split_p=0))[0]: c for c in cards
    }
    permuted = by_causal[False].spec
    assert [str(d) for d in permuted.inputs[0].shape] == ["batch", "sq", "heads", "d"]
    source, plan = TEMPLATE.render(permuted, AttentionMmaParams(warps=4, bkv=64, split_p=0))
    # q [2, 40, 2, 64] as it lies: batch 40 * 2 * 64 apart, heads 64, rows 2 * 64; k and v alike over 72 keys
    expected = {"Q_SB": 5120, "Q_SH": 64, "Q_SS": 128, "K_SB": 9216, "K_SS": 128, "SQ": 40, "SK": 72}
    for name, value in expected.items():
        assert f"#define {name} {value}\n" in source, name
    assert "#define SCALE_LOG2 0.43280851226" in source  # 0.3 log2(e)
    assert plan.grid == [2 * 2 * 1] and plan.block == [128] and plan.args == ["q", "k", "v", "y"]
    assert plan.shared_bytes == (64 + 4 * 64) * 64 * 2


@pytest.fixture(scope="module")
def emulated(captured: tuple[Path, list[Card]]) -> tuple[Path, list[tuple[Card, list[Any]]]]:
    root, cards = captured
    work = root / "emulated"
    work.mkdir()
    chosen = [(card, [p.params for p in TemplateProposer().seeds(card.spec)]) for card in cards]
    build(work, {card.spec.name: emulation_source([namespace(i, card, p) for i, p in enumerate(seeds)])
                 for card, seeds in chosen})  # fmt: skip
    return work, chosen


def test_every_seed_matches_the_captured_calls_on_every_set(
    emulated: tuple[Path, list[tuple[Card, list[Any]]]],
) -> None:
    work, chosen = emulated
    for card, seeds in chosen:
        assert len(seeds) == 4
        assert wrong_outputs(work, card, seeds) == [], card.spec.name


def test_the_heaviest_configurations_build_for_sm90_without_spills(
    captured: tuple[Path, list[Card]], sm90_builder: Builder
) -> None:
    """At the largest head dim, the most keys a tile and P split (the most a thread holds: its scores, P's two
    halves, o and q) for every block size (8 warps: the most shared memory): what `problem` relies on to refuse
    nothing, since every other configuration holds less."""
    _, cards = captured
    spec = cards[0].spec
    long = spec.model_copy(update={"sizes": {**spec.sizes, "d": 128, "dv": 128, "sq": 2048, "sk": 2048}})
    space = TEMPLATE.space(long)
    heaviest = [{"warps": w, "bkv": max(space["bkv"]), "split_p": max(space["split_p"])} for w in space["warps"]]
    renders = [TEMPLATE.render(long, AttentionMmaParams.model_validate(params)) for params in heaviest]
    chosen = [(long, Proposal(source=s, plan=p, mutation="", proposer="test")) for s, p in renders]
    assert len(chosen) == 3 and {p.plan.shared_bytes for _, p in chosen} >= {(128 + 4 * 128) * 128 * 2}
    assert build_problems(sm90_builder, chosen) == []
