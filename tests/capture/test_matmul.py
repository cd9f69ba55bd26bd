"""Matrix products as captured cards (torch on the CPU): mm, bmm and addmm become `matmul` cards whose operands keep
the layout the model gave them (nn.Linear's weight is a transposed view: the card holds it as it lies in memory,
[N, K]), whose stored sets are the model's own tensors and outputs, and whose reference re-runs the op on them; any
other layout, and addmm's beta and alpha, are refused with the reason; the ranking holds the vendor's time against
the matrix ceiling."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.capture import load_capture
from kernelforge_tui.capture.manifest import Variant
from kernelforge_tui.capture.ranking import estimate
from kernelforge_tui.cards import load_card
from kernelforge_tui.proposers.templates.gemm_sm90 import layout_of

if os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch", reason="capture needs torch (CI installs it: .ci/run)")

from kernelforge_tui.capture.run import CaptureRequest, capture_model

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker
MODEL = """
import torch
from torch import nn


class Products(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 48)  # a 2-D input: addmm(bias, x, w^T)
        self.up = nn.Linear(64, 96, bias=False)  # a 3-D input: mm of its rows and w^T
        self.w = nn.Parameter(torch.randn(64, 40))
        self.gated = nn.Linear(64, 32)  # then gelu: one chain card

    def forward(self, x, q, k):
        scores = torch.bmm(q, k.transpose(1, 2))  # b a transposed view
        strided = torch.mm(x[0][:, ::2], self.w[::2])  # every other column: no card
        scaled = torch.addmm(self.proj.bias, x[1], self.proj.weight.t(), beta=0.5)
        return self.proj(x[0]), self.up(x), scores, strided, scaled, torch.nn.functional.gelu(self.gated(x[1]))


def build(device="cpu", size=None, dtype="bfloat16"):
    torch.manual_seed(0)
    model = Products().to(device=device, dtype=getattr(torch, dtype)).eval()
    make = lambda *shape: torch.randn(*shape, device=device, dtype=getattr(torch, dtype))
    return model, (make(2, 16, 64), make(4, 16, 32), make(4, 24, 32))
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Variant], Path]:
    root = tmp_path_factory.mktemp("products")
    (root / "products.py").write_text(MODEL)
    out = root / "products.capture"
    capture_model(CaptureRequest(root / "products.py", out, device="cpu", repeats=1, samples=2))
    return load_capture(out).variants, out


def by_op(variants: list[Variant], op: str) -> list[Variant]:
    return [v for v in variants if v.steps[0].op == op]


def as_op(array: np.ndarray, transposed: bool) -> torch.Tensor:
    """A card array as the op saw it: bf16 exactly, a transposed view where the capture says so."""
    tensor = torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return tensor.transpose(-2, -1) if transposed else tensor


def test_products_become_cards_in_their_captured_layout(captured: tuple[list[Variant], Path]) -> None:
    variants, root = captured
    products = [v for v in variants if v.status == "card" and v.kind == "op" and v.family == "matmul"]
    # the addmm of self.gated (N 32) is its own variant beside its chain's card, as every call of a chain is
    cards = {v.steps[0].op: v for v in products if not v.title.endswith("[64, 32]")}
    assert len(products) == 4 and set(cards) == {"aten.addmm.default", "aten.mm.default", "aten.bmm.default"}
    dims = {}
    for op, variant in cards.items():
        card = load_card(root / str(variant.card))
        assert card.spec.family == "matmul"
        dims[op] = {t.name: t.shape for t in card.spec.inputs}
        transposed = {b.tensor: b.transposed for b in variant.bindings}
        run = {"aten.addmm.default": torch.addmm, "aten.mm.default": torch.mm, "aten.bmm.default": torch.bmm}[op]
        stored = [s for s in card.spec.input_sets if s.file is not None]
        assert stored
        for which in stored:
            inputs, outputs = card.input_set(which)
            a, b = as_op(inputs["a"], transposed["a"]), as_op(inputs["b"], transposed["b"])
            with torch.no_grad():
                eager = run(as_op(inputs["bias"], False), a, b) if "bias" in inputs else run(a, b)
            # the stored arrays are the model's tensors as they lie in memory: the op on them gives its output again
            np.testing.assert_array_equal(outputs["y"].astype(np.float32), eager.float().numpy())
            reference = card.reference(inputs)["y"]
            assert card.spec.outputs[0].effective_tolerance().accepts(outputs["y"], reference).all()
    assert dims["aten.addmm.default"] == {"a": ["M", "K"], "b": ["N", "K"], "bias": ["N"]}  # nn.Linear: w^T
    assert dims["aten.mm.default"] == {"a": ["M", "K"], "b": ["N", "K"]}
    assert dims["aten.bmm.default"] == {"a": ["batch", "M", "K"], "b": ["batch", "N", "K"]}
    assert load_card(root / str(cards["aten.addmm.default"].card)).spec.sizes == {"M": 16, "N": 48, "K": 64}


def test_a_product_then_its_activation_is_one_card_the_gemm_template_fuses(
    captured: tuple[list[Variant], Path],
) -> None:
    variants, root = captured
    [chain] = [v for v in variants if v.kind == "pattern" and v.status == "card"]
    assert [s.op for s in chain.steps] == ["aten.addmm.default", "aten.gelu.default"] and chain.family == "matmul"
    card = load_card(root / str(chain.card))
    assert card.spec.name.startswith("addmm_gelu_bf16") and {t.name: t.shape for t in card.spec.inputs}["b"] == [
        "N",
        "K",
    ]
    transposed = {b.tensor: b.transposed for b in chain.bindings}
    [which] = [s for s in card.spec.input_sets if s.file is not None][:1]
    inputs, outputs = card.input_set(which)
    with torch.no_grad():
        product = torch.addmm(
            as_op(inputs["bias"], False), as_op(inputs["a"], False), as_op(inputs["b"], transposed["b"])
        )
        eager = torch.nn.functional.gelu(product)
    np.testing.assert_array_equal(outputs["y"].astype(np.float32), eager.float().numpy())
    layout = layout_of(card.spec)
    assert not isinstance(layout, str) and (layout.bias, layout.activation) == (True, "gelu")


def test_other_layouts_and_scaled_sums_are_refused_with_the_reason(captured: tuple[list[Variant], Path]) -> None:
    variants, _ = captured
    reasons = {v.reason for v in variants if v.status == "unsupported" and v.steps[0].op in ("aten.mm.default",)}
    assert any("strides" in r and "transposed view" in r for r in reasons), reasons
    [scaled] = [v for v in by_op(variants, "aten.addmm.default") if v.status == "unsupported"]
    assert scaled.reason.startswith("beta 0.5")


def test_the_vendors_time_is_held_against_the_matrix_ceiling() -> None:
    flops = 2 * 2048 * 5632 * 2048
    common = {"family": "matmul", "op": "mm", "pattern": False, "card_bytes": 1, "eager_bytes": 1}
    at_ceiling = estimate(**common, per_call_us=65.0, copy_gbps=4000.0, card_flops=flops, dtype="bfloat16")
    assert at_ceiling.speedup == 1.0 and "cuBLAS" in at_ceiling.how  # under 67.5 us at 700 TFLOP/s + 2 us
    slow = estimate(**common, per_call_us=276.0, copy_gbps=4000.0, card_flops=flops, dtype="bfloat16")
    assert slow.speedup == pytest.approx(276.0 / (flops / 700e6 + 2.0))
    assert estimate(**common, per_call_us=276.0, copy_gbps=None, card_flops=flops, dtype="bfloat16").speedup == 1.0
