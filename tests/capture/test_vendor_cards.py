"""Convolutions, baddbmm and scaled dot-product attention as captured cards (torch on the CPU): each card holds its
tensors as the call laid them out (NCHW or channels-last, a [batch, seq, heads, dim] projection seen as [batch, heads,
seq, dim]), its stored sets are the model's tensors and outputs, its reference re-runs the call (attention: as the
CPU's flash attention) and reproduces them, fresh sets of its odd sizes run through it, and what it cannot hold
(dropout, a logsumexp the model reads) is refused with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.capture import families, load_capture
from kernelforge_tui.capture.calls import Group
from kernelforge_tui.capture.cards import write_card
from kernelforge_tui.capture.manifest import ArgSpec, Binding, Step, TensorMeta, Variant
from kernelforge_tui.capture.ranking import estimate
from kernelforge_tui.cards import load_card, stress
from kernelforge_tui.cards.directory import Card, draw_inputs
from kernelforge_tui.cli.capture import template_problem

if os.environ.get("KERNELFORGE_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch", reason="capture needs torch (CI installs it: .ci/run)")

from kernelforge_tui.capture.run import CaptureRequest, capture_model

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker
MODEL = """
import torch
import torch.nn.functional as F
from torch import nn


class Vendor(nn.Module):
    def __init__(self):
        super().__init__()
        self.plain = nn.Conv2d(4, 6, 3, stride=2, padding=1)  # NCHW, a bias
        last = nn.Conv2d(4, 8, 3, padding=(1, 2), dilation=(1, 2), groups=2, bias=False)
        self.last = last.to(memory_format=torch.channels_last)
        self.line = nn.Conv1d(4, 6, 5, padding=2)

    def forward(self, x, s, q, k, v, c, a, b, m):
        lse_read = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, False)
        return (
            self.plain(x),
            self.last(x.contiguous(memory_format=torch.channels_last)),
            self.line(s),
            torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
            torch.baddbmm(m, a, b),  # c [M, N] broadcast over the batch
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(*(seq_first(t) for t in (q, k, v)), scale=0.3),
            lse_read[1],  # the logsumexp, read: no card
        )


def seq_first(t):  # a [batch, seq, heads, dim] projection seen as [batch, heads, seq, dim], as attention layers do
    return t.reshape(2, t.shape[2], 3, 12).transpose(1, 2)


def build(device="cpu", dtype="float32"):
    torch.manual_seed(0)
    t = getattr(torch, dtype)
    model = Vendor().to(device=device, dtype=t).eval()
    make = lambda *shape: torch.randn(*shape, device=device, dtype=t)
    return model, (make(2, 4, 9, 7), make(2, 4, 11), make(2, 3, 5, 12), make(2, 3, 7, 12), make(2, 3, 7, 12),
                   make(3, 5, 6), make(3, 5, 7), make(3, 7, 6), make(5, 6))
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Variant], Path]:
    root = tmp_path_factory.mktemp("vendor")
    (root / "vendor.py").write_text(MODEL)
    out = root / "vendor.capture"
    capture_model(CaptureRequest(root / "vendor.py", out, device="cpu", repeats=1, samples=2))
    return load_capture(out).variants, out


def carded(variants: list[Variant], root: Path, family: str) -> list[tuple[Variant, Card]]:
    return [(v, load_card(root / str(v.card))) for v in variants if v.status == "card" and v.family == family]


def as_op(array: np.ndarray, binding: Binding) -> torch.Tensor:
    """A card array as the call saw it: its memory permuted back into the call's dims (the captured strides)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if not binding.order:
        return tensor.reshape(binding.op_shape)
    back = sorted(range(len(binding.order)), key=binding.order.__getitem__)
    return tensor.reshape([binding.op_shape[d] for d in binding.order]).permute(back)


def as_card(tensor: torch.Tensor, binding: Binding) -> np.ndarray:
    """A result of the call as the card holds it: as it lies in memory."""
    return (tensor.permute(binding.order) if binding.order else tensor).contiguous().numpy()


def replay(variant: Variant, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The captured call itself on a card set's inputs (torch on the CPU, in the captured dtype): its y, held as the
    card holds it."""
    step = variant.steps[0]
    by_path = {b.path: b for b in variant.bindings if b.role == "input"}
    args, kwargs = [], {}
    for arg in step.args:
        value = as_op(inputs[by_path[arg.path].tensor], by_path[arg.path]) if arg.kind == "tensor" else arg.value
        if arg.path.startswith("kwargs."):
            kwargs[arg.path.removeprefix("kwargs.")] = value
        else:
            args.append(value)
    _, name, overload = step.op.split(".")
    with torch.no_grad():
        out = getattr(getattr(torch.ops.aten, name), overload)(*args, **kwargs)
    y = next(b for b in variant.bindings if b.tensor == "y")
    return as_card(out[0] if isinstance(out, tuple) else out, y)


def check_card(variant: Variant, card: Card) -> None:
    """The stored sets are the call's own outputs bit for bit, the reference reproduces them, and fresh and stress
    sets of the card's (odd) sizes run through the reference and the call alike."""
    tolerance = card.spec.outputs[0].effective_tolerance()
    stored = [s for s in card.spec.input_sets if s.file is not None]
    assert stored
    for which in stored:
        inputs, outputs = card.input_set(which)
        np.testing.assert_array_equal(outputs["y"], replay(variant, inputs))
        assert tolerance.accepts(outputs["y"], card.reference(inputs)["y"]).all()
    fresh = draw_inputs(card.spec, 7)
    expected = card.reference(fresh)["y"]
    assert expected.shape == card.spec.outputs[0].dims(card.spec.sizes)
    assert tolerance.accepts(replay(variant, fresh), expected).all()
    stress.check(card.spec)
    assert stress.running(card.spec) or card.spec.family == "matmul"  # no matrix stress sets are written yet
    for planned in stress.running(card.spec):
        drawn = stress.draw(card.spec, planned.name, fresh)
        assert tolerance.accepts(replay(variant, drawn), card.reference(drawn)["y"]).all(), planned.name


def scalars_of(card: Card) -> dict[str, object]:
    """The scalars the card's recorded call passed, by argument path."""
    assert card.spec.call is not None
    return {a.path: a.value for a in card.spec.call.args if a.kind == "scalar"}


def test_convolutions_keep_their_layout_and_reproduce_the_call(captured: tuple[list[Variant], Path]) -> None:
    variants, root = captured
    cards = {card.spec.name: (v, card) for v, card in carded(variants, root, "convolution")}
    assert set(cards) == {"conv2d_f32_2x4x9x7", "conv2d_f32_2x4x9x7_2", "conv1d_f32_2x4x11"}
    shapes = {name: {t.name: t.shape for t in (*c.spec.inputs, *c.spec.outputs)} for name, (_, c) in cards.items()}
    assert shapes["conv2d_f32_2x4x9x7"] == {
        "x": ["n", "c", "h", "w"],
        "weight": ["o", "cg", "kh", "kw"],
        "bias": ["o"],
        "y": ["n", "o", "oh", "ow"],
    }
    # channels-last as captured: the input, the weight and the output cuDNN (here oneDNN) returned lie NHWC
    assert shapes["conv2d_f32_2x4x9x7_2"] == {
        "x": ["n", "h", "w", "c"],
        "weight": ["o", "kh", "kw", "cg"],
        "y": ["n", "oh", "ow", "o"],
    }
    assert shapes["conv1d_f32_2x4x11"]["x"] == ["n", "c", "w"]
    variant, card = cards["conv2d_f32_2x4x9x7_2"]
    assert {b.tensor: b.order for b in variant.bindings} == {
        "x": [0, 2, 3, 1],
        "weight": [0, 2, 3, 1],
        "y": [0, 2, 3, 1],
    }
    assert card.spec.sizes["groups"] == 2 and card.spec.sizes["cg"] == 2
    baseline = (root / str(variant.card) / "baseline.cu").read_text()
    assert all(f"#define {k} {v}\n" in baseline for k, v in {"PW": 2, "DW": 2, "GROUPS": 2, "SH": 1}.items())
    sizes = cards["conv2d_f32_2x4x9x7"][1].spec.sizes
    assert (sizes["oh"], sizes["ow"]) == (5, 4)  # stride 2, padding 1 of 9 x 7
    # the call with its scalars, for a template to read: the dilated, grouped one's as the model passed them
    call = card.spec.call
    assert call is not None and call.op == "aten.convolution.default"
    passed = {a.path: a.value if a.kind != "input" else a.input for a in call.args}
    assert passed == {
        "args[0]": "x",
        "args[1]": "weight",
        "args[2]": None,
        "args[3]": [1, 1],
        "args[4]": [1, 2],
        "args[5]": [1, 2],
        "args[6]": False,
        "args[7]": [0, 0],
        "args[8]": 2,
    }
    # the implicit-GEMM template says why it does not serve these (bf16 channels-last cards: its own tests)
    notes = {name: str(template_problem(card.spec)) for name, (_, card) in cards.items()}
    assert "convert the model with .to(memory_format=torch.channels_last)" in notes["conv2d_f32_2x4x9x7"]
    assert "conv_igemm: tensor cores take one of ['bfloat16', 'float16']" in notes["conv2d_f32_2x4x9x7_2"]
    assert "conv_igemm: card lacks sizes ['h', 'kh', 'oh']" in notes["conv1d_f32_2x4x11"]
    for variant, card in cards.values():
        check_card(variant, card)


def test_baddbmm_is_carded_with_its_beta_alpha_and_broadcast_c(captured: tuple[list[Variant], Path]) -> None:
    variants, root = captured
    cards = [(v, c) for v, c in carded(variants, root, "matmul") if v.steps[0].op == "aten.baddbmm.default"]
    assert len(cards) == 2
    c_dims = {str(v.card): next(t.shape for t in c.spec.inputs if t.name == "c") for v, c in cards}
    assert sorted(c_dims.values()) == [["M", "N"], ["batch", "M", "N"]]
    scaled = next(v for v, _ in cards if c_dims[str(v.card)][0] == "batch")
    baseline = (root / str(scaled.card) / "baseline.cu").read_text()
    assert "#define BETA 0.5f" in baseline and "#define ALPHA 2.0f" in baseline
    for variant, card in cards:
        assert "gemm_sm90: wgmma (fp32 is the matmul template's) takes one of ['bfloat16', 'float16']" in str(
            template_problem(card.spec)
        )
        check_card(variant, card)


def test_attention_keeps_its_layout_flag_and_scale(captured: tuple[list[Variant], Path]) -> None:
    variants, root = captured
    cards = carded(variants, root, "attention")
    assert len(cards) == 2
    by_layout = {tuple(next(t.shape for t in c.spec.inputs if t.name == "q")): (v, c) for v, c in cards}
    causal, causal_card = by_layout[("batch", "heads", "sq", "d")]
    assert "#define CAUSAL 1" in (root / str(causal.card) / "baseline.cu").read_text()
    assert causal_card.spec.sizes == {"batch": 2, "heads": 3, "sq": 5, "sk": 7, "d": 12, "dv": 12}
    permuted, card = by_layout[("batch", "sq", "heads", "d")]  # q.reshape(b, s, h, d).transpose(1, 2): as it lies
    assert {b.tensor: b.order for b in permuted.bindings} == {name: [0, 2, 1, 3] for name in "qkvy"}
    baseline = (root / str(permuted.card) / "baseline.cu").read_text()
    assert "#define CAUSAL 0" in baseline and "#define SCALE 0.3f" in baseline
    # recorded as the call the reference replays (CPU flash attention: dropout, is_causal, scale at fixed places)
    assert scalars_of(card) == {"args[3]": 0.0, "args[4]": False, "kwargs.scale": 0.3}
    assert scalars_of(causal_card) == {"args[3]": 0.0, "args[4]": True, "kwargs.scale": 12**-0.5}
    assert [o.name for o in card.spec.outputs] == ["y"]  # the logsumexp nothing reads is no output
    for variant, card in cards:
        assert "attention_mma: tensor cores take one of ['bfloat16', 'float16']" in str(template_problem(card.spec))
        check_card(variant, card)


def test_a_read_logsumexp_is_refused_with_the_reason(captured: tuple[list[Variant], Path]) -> None:
    variants, _ = captured
    [refused] = [v for v in variants if v.steps[0].op.startswith("aten._scaled_dot_product") and v.status != "card"]
    assert refused.reason.startswith("the model reads out[1] of aten._scaled_dot_product_flash_attention_for_cpu")


def cuda_attention(dropout: float) -> Group:
    """CUDA's memory-efficient attention as the recorder writes it (q, k, v, attn_bias, compute_log_sumexp,
    dropout_p, is_causal, scale): the CPU has no such kernel, so the call is built by hand."""
    meta = TensorMeta(shape=[2, 3, 5, 12], stride=[180, 60, 12, 1], dtype="float32", device="cuda:0", contiguous=True)
    args = [ArgSpec(path=f"args[{n}]", kind="tensor", tensor=meta) for n in range(3)]
    args += [
        ArgSpec(path="args[3]", kind="none"),
        ArgSpec(path="args[4]", kind="scalar", value=False),
        ArgSpec(path="args[5]", kind="scalar", value=dropout),
        ArgSpec(path="args[6]", kind="scalar", value=True),
    ]
    lse = TensorMeta(shape=[2, 3, 0], stride=[0, 0, 1], dtype="float32", device="cuda:0", contiguous=True)
    step = Step(op="aten._scaled_dot_product_efficient_attention.default", args=args, outputs=[meta, lse, None, None])
    return Group(kind="op", op=step.op, key=step.op, instances=[[0]], steps=[step], read=[{0}])


def test_cuda_attention_is_replayed_as_the_cpus_and_dropout_is_refused(tmp_path: Path) -> None:
    refused = families.plan(cuda_attention(0.1))
    assert isinstance(refused, families.NoCard) and refused.reason.startswith("dropout_p 0.1: an attention card is")
    plan = families.plan(cuda_attention(0.0))
    assert isinstance(plan, families.CardPlan)
    assert [s.op for s in plan.replay] == ["aten._scaled_dot_product_flash_attention_for_cpu.default"]
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 12) for _ in range(3))
    with torch.no_grad():
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # args[6]: causal
    sample = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "y": y.numpy()}
    written = write_card(tmp_path / "attention", "attention", plan, cuda_attention(0.0).steps, [sample], "test")
    assert written.stored == 1 and written.precision == "float64"


def test_convolution_and_attention_are_held_against_the_matrix_ceiling() -> None:
    flops = 2 * 4 * 512 * 64 * 64 * 512 * 9
    common = {"op": "conv2d", "pattern": False, "card_bytes": 1, "eager_bytes": 1, "card_flops": flops}
    slow = estimate(family="convolution", **common, per_call_us=900.0, copy_gbps=4000.0, dtype="bfloat16")
    assert slow.speedup == pytest.approx(900.0 / (flops / 700e6 + 2.0)) and "cuDNN" in slow.how
    prior = estimate(family="attention", **common, per_call_us=900.0, copy_gbps=None, dtype="bfloat16")
    assert prior.speedup == 1.0 and "flash attention" in prior.how
    # a depthwise 3x3 convolution (groups = c) does 9 multiply-adds an element: its bytes bound it, not its FLOPs
    depthwise = {**common, "card_flops": 2 * 4 * 512 * 64 * 64 * 9, "card_bytes": 2 * 2 * 4 * 512 * 64 * 64}
    memory = estimate(family="convolution", **depthwise, per_call_us=30.0, copy_gbps=4000.0, dtype="bfloat16")
    copy_us = depthwise["card_bytes"] / (0.88 * 4000.0 * 1e3)
    assert memory.speedup == pytest.approx(30.0 / (copy_us + 2.0)) and "copy ceiling" in memory.how


def test_a_manifest_that_says_transposed_still_loads() -> None:
    """Captures written before `Binding.order` said `transposed: true` for a matrix operand's swapped view."""
    old = {"tensor": "b", "role": "input", "step": 0, "path": "args[1]", "op_shape": [4, 8, 3], "card_shape": [4, 3, 8]}
    binding = Binding.model_validate({**old, "transposed": True})
    assert binding.order == [0, 2, 1] and binding.transposed
    assert Binding.model_validate({**old, "transposed": False}).order == []


def test_a_tensor_is_held_in_its_memory_order_or_refused_with_its_strides() -> None:
    def meta(shape: list[int], stride: list[int]) -> TensorMeta:
        return TensorMeta(shape=shape, stride=stride, dtype="float32", device="cpu", contiguous=False)

    assert families.memory_order(meta([2, 4, 9, 7], [252, 1, 28, 4]), "x") == (0, 2, 3, 1)  # channels-last
    assert families.memory_order(meta([2, 3, 5, 12], [180, 12, 36, 1]), "q") == (0, 2, 1, 3)
    assert families.memory_order(meta([2, 1, 9, 7], [63, 1, 7, 1]), "x") == ()  # a dim of 1 leaves it row-major
    with pytest.raises(families.Refuse, match=r"strides \[126, 63, 14, 2\].*not dense"):
        families.memory_order(meta([2, 2, 9, 7], [126, 63, 14, 2]), "x")  # every other column
