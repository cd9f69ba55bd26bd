"""Fused chains in `kernelforge capture` (CPU, torch installed): tests/support/fixtures/chains_model.py has one of each
chain (residual add then layer_norm and rms_norm, bias add then GELU, scale and causal mask then softmax, silu(gate) *
up, group_norm then SiLU). Each becomes one card with its calls' wiring recorded; an intermediate the model also uses is
never fused; the card's reference re-runs the calls in order and equals the unfused calls; the chain is ranked by the
time of all its calls; its record survives the card files. Pass C's timings are replaced by known numbers, so that the
sums are exact."""

from __future__ import annotations

import itertools
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelforge_tui.capture import load_capture, patterns
from kernelforge_tui.capture.manifest import CaptureManifest, Variant
from kernelforge_tui.cards import CardError, load_card, save_card
from kernelforge_tui.cards.chain import Chain
from kernelforge_tui.cards.directory import draw_inputs

if os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch", reason="capture needs torch (CI installs it: .ci/run)")
import torch.nn.functional as F

from kernelforge_tui.capture.run import CaptureRequest, capture_model
from kernelforge_tui.cli.capture import template_problem

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker
MODEL = Path(__file__).parents[1] / "support" / "fixtures" / "chains_model.py"
CHAINS = {
    "residual_layer_norm",
    "residual_rms_norm",
    "bias_gelu",
    "scale_mask_softmax",
    "silu_mul",
    "group_norm_silu",
}


def _capture(out: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> CaptureManifest:
    """The fixture model captured with pass C's per-call times replaced by 1, 2, 4, ... us (call k: 2^k mod 97 + 1):
    each call's time known, and no sum of others equal to it by accident."""
    from kernelforge_tui.capture import recorder

    real = recorder.time_calls

    def known(*args: Any) -> recorder.Timings:
        timings = real(*args[:-1], 1)
        timings.per_call_us = [float(pow(2, k, 97) + 1) for k in range(len(timings.per_call_us))]
        return timings

    monkeypatch.setattr(recorder, "time_calls", known)
    capture_model(CaptureRequest(MODEL, out, device="cpu", repeats=1, samples=2, kwargs=kwargs), template_problem)
    return load_capture(out)


@pytest.fixture(scope="module")
def chained(tmp_path_factory: pytest.TempPathFactory) -> tuple[CaptureManifest, Path]:
    out = tmp_path_factory.mktemp("chains") / "chains.capture"
    with pytest.MonkeyPatch.context() as patch:
        return _capture(out, patch), out


@pytest.fixture(scope="module")
def escaping(tmp_path_factory: pytest.TempPathFactory) -> tuple[CaptureManifest, Path]:
    out = tmp_path_factory.mktemp("escaping") / "escaping.capture"
    with pytest.MonkeyPatch.context() as patch:
        return _capture(out, patch, escape=True), out


def _chains(manifest: CaptureManifest) -> dict[str, Variant]:
    return {v.op: v for v in manifest.variants if v.kind == "pattern"}


def _record(root: Path, variant: Variant) -> Chain:
    chain = load_card(root / str(variant.card)).spec.chain
    assert chain is not None, variant.card
    return chain


def test_every_chain_is_found_and_carded_with_its_wiring(chained: tuple[CaptureManifest, Path]) -> None:
    manifest, root = chained
    found = _chains(manifest)
    assert set(found) == CHAINS
    assert all(v.status == "card" and v.calls == 1 and not v.replaceable for v in found.values())

    layer = _record(root, found["residual_layer_norm"])
    assert [s.op for s in layer.steps] == ["aten.add.Tensor", "aten.native_layer_norm.default"]
    add, norm = layer.steps
    assert [(a.kind, a.input) for a in add.args] == [("input", "x"), ("input", "r")]
    assert (norm.args[0].kind, norm.args[0].step, norm.args[0].out) == ("step", 0, 0)
    assert [(a.kind, a.input or a.value) for a in norm.args[1:]] == [
        ("scalar", [32]),
        ("input", "w"),
        ("input", "b"),
        ("scalar", 1e-5),
    ]
    assert norm.results == 3 and layer.outputs == {"y": (1, 0)}  # y is the first of (y, mean, rstd)

    rms = _record(root, found["residual_rms_norm"])  # the add, then F.rms_norm decomposed (the CPU's)
    assert rms.steps[0].op == "aten.add.Tensor" and rms.steps[1].op == "aten.pow.Tensor_Scalar"
    assert rms.input_names() == ["x", "r", "w"] and rms.outputs == {"y": (len(rms.steps) - 1, 0)}
    reads_sum = [k for k, s in enumerate(rms.steps) for a in s.args if (a.kind, a.step) == ("step", 0)]
    assert reads_sum == [1, 5]  # the sum's square and its product with the rsqrt: both inside the chain

    bias = _record(root, found["bias_gelu"])
    assert [s.op for s in bias.steps] == ["aten.add.Tensor", "aten.gelu.default"]
    card = load_card(root / str(found["bias_gelu"].card)).spec
    assert [(t.name, t.dims(card.sizes)) for t in card.inputs] == [("x", (16, 32)), ("b", (32,))]

    softmax = _record(root, found["scale_mask_softmax"])
    div, masked, soft = softmax.steps
    assert (div.op, div.args[1].kind, div.args[1].value) == ("aten.div.Tensor", "scalar", math.sqrt(16))
    assert (masked.args[0].step, masked.args[1].input) == (0, "mask") and soft.args[0].step == 1
    sizes = load_card(root / str(found["scale_mask_softmax"].card)).spec.sizes
    assert sizes == {"rows": 32, "cols": 8, "mask_rows": 8, "heads": 4, "seq": 8}  # [8, 8] over [2, 2, 8, 8]

    assert _record(root, found["silu_mul"]).input_names() == ["gate", "up"]
    group = _record(root, found["group_norm_silu"])
    assert [s.op for s in group.steps] == ["aten.native_group_norm.default", "aten.silu.default"]
    assert group.input_names() == ["x", "gamma", "beta"] and group.outputs == {"y": (1, 0)}


def test_each_call_of_a_chain_stays_a_variant_of_its_own(chained: tuple[CaptureManifest, Path]) -> None:
    """Eager PyTorch replaces single calls: the chain's calls keep their own variants (and cards), the trace names
    them, and the chain lists its calls."""
    manifest, _ = chained
    by_id = {v.id: v for v in manifest.variants}
    for chain in _chains(manifest).values():
        [calls] = chain.instances
        own = [by_id[manifest.trace[k]] for k in calls]
        assert all(v.kind == "op" for v in own) and [v.steps[0].op for v in own] == [s.op for s in chain.steps]
    silu = next(v for v in manifest.variants if v.kind == "op" and v.steps[0].op == "aten.silu.default")
    assert silu.status == "card"  # SwiGLU's silu alone, for eager, beside the silu_mul chain


def test_an_intermediate_the_model_also_uses_is_not_fused(escaping: tuple[CaptureManifest, Path]) -> None:
    """The escaping model returns every chain's intermediate: no chain but the mask's (the scaled scores escape, their
    sum with the mask does not) and the rms_norm inside the residual chain is fused."""
    manifest, root = escaping
    found = _chains(manifest)
    assert set(found) == {"mask_softmax", "rms_norm"}
    assert [s.op for s in _record(root, found["mask_softmax"]).steps] == ["aten.add.Tensor", "aten._softmax.default"]
    rms = _record(root, found["rms_norm"])  # fp32: x read by its square and by its product with the rsqrt
    assert [k for k, s in enumerate(rms.steps) for a in s.args if a.input == "x"] == [0, 4]


def _unfused(op: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each chain as the model's separate eager calls."""
    if op == "residual_layer_norm":
        return F.layer_norm(t["x"] + t["r"], (32,), t["w"], t["b"], 1e-5)
    if op == "residual_rms_norm":
        return F.rms_norm(t["x"] + t["r"], (32,), t["w"], 1e-6)
    if op == "bias_gelu":
        return F.gelu(t["x"] + t["b"])
    if op == "scale_mask_softmax":
        return torch.softmax(t["x"] / 4.0 + t["mask"], dim=-1)
    if op == "silu_mul":
        return F.silu(t["gate"]) * t["up"]
    return F.silu(F.group_norm(t["x"], 4, t["gamma"], t["beta"], 1e-5))


def test_the_fused_reference_equals_the_unfused_calls(chained: tuple[CaptureManifest, Path]) -> None:
    manifest, root = chained
    for op, variant in _chains(manifest).items():
        card = load_card(root / str(variant.card))
        shapes = {b.tensor: b.op_shape for b in variant.bindings}
        out = card.spec.outputs[0]
        for inputs in [card.input_set(s)[0] for s in card.spec.input_sets if s.file] + [draw_inputs(card.spec, 7)]:
            tensors = {name: torch.from_numpy(a).reshape(shapes[name]) for name, a in inputs.items()}
            with torch.no_grad():
                eager = _unfused(op, tensors).reshape(out.dims(card.spec.sizes)).numpy()
            fused = card.reference(inputs)[out.name]
            assert out.effective_tolerance().accepts(eager, fused).all(), op
            np.testing.assert_allclose(fused, eager, rtol=1e-5, atol=1e-6, err_msg=op)


def test_a_chain_is_ranked_by_the_time_of_all_its_calls(chained: tuple[CaptureManifest, Path]) -> None:
    manifest, _ = chained
    per_call = [float(pow(2, k, 97) + 1) for k in range(manifest.calls)]
    assert manifest.total_time_us == pytest.approx(sum(per_call))  # the chains' time is not counted twice
    for chain in _chains(manifest).values():
        assert chain.time_us == pytest.approx(sum(per_call[k] for k in chain.instances[0]))
        assert chain.share == pytest.approx(chain.time_us / manifest.total_time_us)
        assert chain.expected_saving > 0
    ranked = sorted(manifest.variants, key=lambda v: v.rank)
    assert [v.rank for v in ranked] == list(range(1, len(ranked) + 1))
    assert all(a.expected_saving >= b.expected_saving for a, b in itertools.pairwise(ranked))


def test_a_chain_card_round_trips_through_its_files(chained: tuple[CaptureManifest, Path], tmp_path: Path) -> None:
    manifest, root = chained
    for variant in _chains(manifest).values():
        card = load_card(root / str(variant.card))
        assert "\n[chain]\n" in (card.root / "card.toml").read_text()
        stored = {s.name: card.input_set(s) for s in card.spec.input_sets if s.file}
        (tmp_path / str(variant.card)).mkdir()
        shutil.copy(card.root / "baseline.cu", tmp_path / str(variant.card))
        copy = save_card(card.spec, tmp_path / str(variant.card), stored)
        assert copy.spec == card.spec and copy.spec.chain is not None
    text = (root / str(_chains(manifest)["bias_gelu"].card) / "card.toml").read_text()
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(root / str(_chains(manifest)["bias_gelu"].card) / "baseline.cu", broken)
    (broken / "card.toml").write_text(text.replace('input = "b"', 'input = "bias"'))
    with pytest.raises(CardError, match=r"chain.*\['bias'\], which are not inputs of the card"):
        load_card(broken)


STREAM = Path(__file__).parents[1] / "support" / "fixtures" / "stream_model.py"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_residual_sum_the_model_reads_again_is_written_by_its_chain(tmp_path: Path, dtype: str) -> None:
    """Llama's and ViT's residual streams (stream_model.py, their libraries' forms): each block's sum is read by the
    next norm and by the next residual add, so its chain writes the sum too (s beside y, the sum's readers after the
    norm); the last sum, read by the final norm alone, is the plain chain. LlamaRMSNorm's decomposed form (with its
    casts in bf16) is the rms_norm pattern; ViT's eps 1e-6 does not keep a chain card from the chain template."""
    out = tmp_path / "stream.capture"
    capture_model(
        CaptureRequest(STREAM, out, device="cpu", repeats=1, samples=1, kwargs={"dtype": dtype}), template_problem
    )
    found = _chains(load_capture(out))
    assert set(found) == {
        "rms_norm",
        "residual_sum_rms_norm",
        "silu_mul",
        "residual_rms_norm",
        "residual_sum_layer_norm",
        "residual_layer_norm",
    }
    assert all(v.status == "card" and v.calls == 1 and v.template for v in found.values())
    for norm in ("rms_norm", "layer_norm"):
        kept, plain = _record(out, found[f"residual_sum_{norm}"]), _record(out, found[f"residual_{norm}"])
        last = len(kept.steps) - 1
        assert kept.outputs == {"s": (0, 0), "y": (last, 0)} and plain.outputs == {"y": (len(plain.steps) - 1, 0)}
        card = load_card(out / str(found[f"residual_sum_{norm}"].card)).spec
        assert [t.name for t in card.outputs] == ["s", "y"] and card.family == norm
    casts = [s.op for s in _record(out, found["rms_norm"]).steps].count("aten._to_copy.default")
    assert casts == (2 if dtype == "bfloat16" else 0)  # to float32 and back, as LlamaRMSNorm writes it


BOTTLENECK = Path(__file__).parents[1] / "support" / "fixtures" / "bottleneck_model.py"


@pytest.mark.parametrize("channels_last", [False, True])
def test_resnets_batch_norms_are_chained_with_their_in_place_add_and_relu(tmp_path: Path, channels_last: bool) -> None:
    """torchvision's Bottleneck (bottleneck_model.py): each eval batch norm then ReLU(inplace=True) is a
    batch_norm_relu chain, the last with `out += identity` between them a batch_norm_add_relu chain, their calls in
    place as the model ran them; the card holds x, r and y as they lie in memory (channels-last: [n, hw, c])."""
    out = tmp_path / "bottleneck.capture"
    kwargs = {"channels_last": channels_last}
    capture_model(CaptureRequest(BOTTLENECK, out, device="cpu", repeats=1, samples=1, kwargs=kwargs), template_problem)
    found = _chains(load_capture(out))
    assert set(found) == {"batch_norm_relu", "batch_norm_add_relu"}
    assert found["batch_norm_relu"].calls == 2 and found["batch_norm_add_relu"].calls == 1
    assert all(v.status == "card" and v.template for v in found.values())
    chain = _record(out, found["batch_norm_add_relu"])
    norm, add, relu = chain.steps
    assert (norm.op, add.op, relu.op) == ("aten.native_batch_norm.default", "aten.add_.Tensor", "aten.relu_.default")
    assert (add.args[0].kind, add.args[0].step, add.args[1].input) == ("step", 0, "r")  # in place into the norm's
    card = load_card(out / str(found["batch_norm_add_relu"].card)).spec
    layout = ["n", "hw", "c"] if channels_last else ["n", "c", "hw"]
    assert [(t.name, t.shape) for t in card.inputs if t.name in ("x", "r")] == [("x", layout), ("r", layout)]
    assert [t.name for t in card.inputs] == ["x", "w", "b", "mean", "var", "r"] and card.family == "elementwise"


def test_a_16_bit_batch_norm_before_a_residual_add_allows_one_rounding_step_of_it(tmp_path: Path) -> None:
    """Eager rounds the batch norm to bf16 before `out += identity`; another correct fp32 order (the CPU reference's,
    a kernel's) may round it one step the other way (the H100 saw ResNet-50's cards fail so), and where the sum
    cancels, y keeps that step whole. The card's tolerance accepts either rounding on its stored set and on a seeded
    one, which a norm's atol 1e-3 does not; batch_norm_relu, with no add to cancel, keeps 1e-3."""
    import ml_dtypes

    out = tmp_path / "bottleneck.capture"
    request = CaptureRequest(BOTTLENECK, out, device="cpu", repeats=1, samples=1, kwargs={"dtype": "bfloat16"})
    capture_model(request, template_problem)
    found = _chains(load_capture(out))
    card = load_card(out / str(found["batch_norm_add_relu"].card))
    plain = load_card(out / str(found["batch_norm_relu"].card)).spec.outputs[0].effective_tolerance()
    tolerance = card.spec.outputs[0].effective_tolerance()
    assert plain.atol == 1e-3 < tolerance.atol and "one rounding step" in card.spec.description
    norm_only = type(tolerance)(rtol=tolerance.rtol, atol=plain.atol)
    stored = next(s for s in card.spec.input_sets if s.file is not None)
    for inputs in (card.input_set(stored)[0], draw_inputs(card.spec, 5)):
        f = {name: array.astype(np.float64) for name, array in inputs.items()}

        def per_channel(name: str, values: dict[str, np.ndarray] = f) -> np.ndarray:
            return values[name].reshape(1, -1, 1)

        bn = (f["x"] - per_channel("mean")) / np.sqrt(per_channel("var") + 1e-5) * per_channel("w") + per_channel("b")
        near = bn.astype(ml_dtypes.bfloat16)
        off = (near.view(np.uint16) + 1).view(ml_dtypes.bfloat16)  # one step further from zero
        eager, other = (np.maximum((b.astype(np.float64) + f["r"]).astype(ml_dtypes.bfloat16), 0) for b in (near, off))
        assert tolerance.accepts(other, eager).all()
        assert not norm_only.accepts(other, eager).all()


def test_the_rounding_step_is_taken_at_the_largest_norm_captured_or_drawn() -> None:
    """`sum_tolerance` on hand-computed numbers: with no captured sample, the seeded sets' bound, (|x| + |mean|) *
    |w| / sqrt(smallest var + eps) + |b| at the distributions' extents; a captured outlier beyond it, exactly."""
    from kernelforge_tui.capture.cards import sum_tolerance
    from kernelforge_tui.capture.families import RoundedBeforeSum
    from kernelforge_tui.cards.model import Distribution, Tolerance

    base, rounded = Tolerance(rtol=1.6e-2, atol=1e-3), RoundedBeforeSum(2.0**-8, 1e-5, 1)
    drawn = {
        "x": Distribution(kind="normal", mean=0.0, std=1.0),
        "mean": Distribution(kind="uniform", low=-0.5, high=0.5),
        "w": Distribution(kind="uniform", low=0.5, high=1.5),
        "var": Distribution(kind="uniform", low=0.25, high=2.0),
        "b": Distribution(kind="uniform", low=-0.5, high=0.5),
    }
    bound = (4 + 0.5) * 1.5 / math.sqrt(0.25 + 1e-5) + 0.5
    tolerance, note = sum_tolerance(base, rounded, [], drawn)
    assert tolerance.atol == pytest.approx(1e-3 + 2 * 2.0**-8 * bound) and f"|batch_norm(x)| {bound:.3g}:" in note
    x = np.zeros((1, 2, 3))
    x[0, 1, 2] = 100.0  # channel 1: (100 - 0) * 2 / sqrt(4 + eps) - 1
    sample = {
        "x": x,
        "w": np.array([1.0, 2.0]),
        "b": np.array([0.0, -1.0]),
        "mean": np.zeros(2),
        "var": np.full(2, 4.0),
    }
    tolerance, _ = sum_tolerance(base, rounded, [sample], drawn)
    assert tolerance.atol == pytest.approx(1e-3 + 2 * 2.0**-8 * (200 / math.sqrt(4 + 1e-5) - 1))


INTO_INPUT = """
import torch
from torch import nn


class IntoInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x, y):
        y += self.bn(x)  # in place into the model's input y, which the chain cannot write
        return torch.relu(y), torch.relu_(self.bn(x))


def build(device="cpu"):
    return IntoInput().eval(), (torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3))
"""


def test_a_chain_never_writes_in_place_into_a_tensor_from_outside_it(tmp_path: Path) -> None:
    """`y += bn(x)` adds in place into the model's input: the batch norm, add and relu there are no chain (its
    kernel would leave y as it was); relu_ in place into the norm's own result is one."""
    model = tmp_path / "into_input.py"
    model.write_text(INTO_INPUT)
    out = tmp_path / "into_input.capture"
    capture_model(CaptureRequest(model, out, device="cpu", repeats=1, samples=1), template_problem)
    found = _chains(load_capture(out))
    assert set(found) == {"batch_norm_relu"} and found["batch_norm_relu"].calls == 1
    assert [s.op for s in _record(out, found["batch_norm_relu"]).steps][-1] == "aten.relu_.default"


def test_a_mask_broadcasts_over_the_rows_only_as_batch_1_seq() -> None:
    b, h, s = 2, 3, 5
    assert patterns.mask_layout([b, h, s, 7], [1, 1, s, 7]) == (1, b * h, s)
    assert patterns.mask_layout([b, h, s, 7], [b, 1, s, 7]) == (b, h, s)
    assert patterns.mask_layout([b, h, s, 7], [s, 7]) == (1, b * h, s)
    assert patterns.mask_layout([b, h, s, 7], [b, h, s, 7]) == (b * h * s, 1, 1)
    assert patterns.mask_layout([b, h, s, 7], [b, h, 1, 7]) == (b * h, s, 1)
    assert patterns.mask_layout([b, h, s, 7], [1, h, 1, 7]) is None  # two broadcast runs
    assert patterns.mask_layout([b, h, s, 7], [b, h, s, 1]) is None  # along the softmax's own axis
    for x, mask in (([b, h, s, 7], [b, 1, s, 7]), ([b, h, s, 7], [b, h, 1, 7]), ([b, h, s, 7], [1, 1, s, 7])):
        _, heads, seq = patterns.mask_layout(x, mask) or (0, 0, 0)
        m = torch.arange(math.prod(mask)).reshape(mask)
        rows = torch.broadcast_to(m, x).reshape(-1, 7)[:, 0]
        table = m.reshape(-1, 7)[:, 0]
        assert [int(table[r // (heads * seq) * seq + r % seq]) for r in range(len(rows))] == rows.tolist()
