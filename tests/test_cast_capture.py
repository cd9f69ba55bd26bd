"""Exporting from a capture directory: the decoder block captured on the CPU (torch), a made-up GPU run of its
softmax variant, and the package's guard taken from the captured call; every variant audited."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kernelforge_tui.capture.manifest import load_capture
from kernelforge_tui.cards import load_card
from kernelforge_tui.cast.bindings import from_variant
from kernelforge_tui.cast.export import export
from kernelforge_tui.cli.main import main
from kernelforge_tui.gpu.build import find_nvcc

from .fixtures.cast.cast_support import EXAMPLES, make_run

MODEL = EXAMPLES / "models" / "decoder_block.py"


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("capture") / "decoder"
    assert main(["capture", str(MODEL), "--device", "cpu", "-o", str(out)]) == 0
    return out


def _softmax(capture: Path) -> tuple[object, Path]:
    manifest = load_capture(capture)
    (variant,) = [v for v in manifest.variants if v.op == "aten._softmax.default" and v.card]
    assert variant.card is not None
    return variant, capture / variant.card


def test_a_captured_softmax_binds_to_its_exact_call(captured: Path) -> None:
    variant, card_dir = _softmax(captured)
    binding = from_variant(variant, load_card(card_dir).spec)
    assert not isinstance(binding, str), binding
    assert binding.overload == "aten::_softmax.default"
    (x,) = binding.inputs
    assert x.shape == (2, 4, 16, 16) and x.dtype == "bfloat16" and x.strides == (1024, 256, 16, 1)
    assert 0 < x.alignment <= 256
    assert [(a.position, a.tensor, a.accepts) for a in binding.args] == [
        (0, "x", []),
        (1, None, [-1]),
        (2, None, [False]),
    ]
    assert [(t.name, t.shape) for t in binding.outputs] == [("y", (2, 4, 16, 16))]


def test_a_fused_pattern_is_not_overridable(captured: Path) -> None:
    manifest = load_capture(captured)
    pattern = next(v for v in manifest.variants if v.kind == "pattern" and v.card)
    assert pattern.card is not None
    reason = from_variant(pattern, load_card(captured / pattern.card).spec)
    assert isinstance(reason, str) and "fused pattern" in reason


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed (CI has it)")
def test_export_from_a_capture_audits_every_variant(captured: Path, tmp_path: Path) -> None:
    capture = tmp_path / "decoder"
    shutil.copytree(captured, capture)
    variant, card_dir = _softmax(capture)
    card = load_card(card_dir)
    assert card.spec.baseline is not None
    make_run(capture / "runs" / "softmax", card_dir, card.baseline_source(), card.spec.baseline.plan, 10.0, 100.0)
    manifest = export(capture, tmp_path / "model.cast", sanitize=False, arch="sm_90")
    (kernel,) = manifest.kernels
    assert kernel.guard.inputs[0].shape == (2, 4, 16, 16) and kernel.guard.overload == "aten::_softmax.default"
    assert kernel.variant.startswith(variant.id)  # type: ignore[attr-defined]
    decisions = {a.variant.split()[0]: (a.decision, a.reason) for a in manifest.audit}
    assert len(decisions) == len(load_capture(capture).variants)
    assert decisions[variant.id][0] == "kernel"  # type: ignore[attr-defined]
    others = [reason for vid, (decision, reason) in decisions.items() if decision == "fallback"]
    assert any("fused pattern" in r for r in others)
    assert any("no run of its card" in r for r in others), others
