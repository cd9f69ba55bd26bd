"""The implicit-GEMM convolution template (CUTLASS 2.x): which captured convolution cards it serves and why not the
others, how it reads the call's geometry and sizes its launch, and real sandboxed nvcc builds of renders (the
CUTLASS headers of the `cutlass` extra) without spills. The kernels run on the H200 in bench/conv_cutlass.py."""

from __future__ import annotations

from typing import Any

from bench.conv_cutlass import CASES, card_of
from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.build.source_policy import DEFAULT_ALLOWED_INCLUDES
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.conv_igemm import ConvIgemmTemplate, ConvParams
from tests.support.cutlass_marks import needs_cutlass
from tests.support.nvcc_marks import needs_nvcc
from tests.support.seed_builds import build_problems

pytestmark = needs_cutlass
TEMPLATE = ConvIgemmTemplate()
BY_NAME = {case["name"]: case for case in CASES}
DIFFUSION = card_of(BY_NAME["diffusion_3x3"])
TAILS = card_of(BY_NAME["tails"])
STRIDED = card_of(BY_NAME["resnet_s2_3x3_stride2"])
"""A card this template serves and the Hopper one (conv_sm90, stride 1 only) does not, so the library gives it here."""
BASE = ConvParams(tile_m=128, tile_n=128, tile_k=64, warp_m=64, warp_n=64, stages=3, swizzle=1)


def changed(card: OperatorCard, **changes: Any) -> OperatorCard:
    """The card with some sizes, tensor dims or its call changed (`call_args`: path -> value)."""
    update: dict[str, Any] = {}
    if "sizes" in changes:
        update["sizes"] = {**card.sizes, **changes["sizes"]}
    if "dims" in changes:
        tensors = [t.model_copy(update={"shape": changes["dims"].get(t.name, t.shape)}) for t in card.inputs]
        outputs = [t.model_copy(update={"shape": changes["dims"].get(t.name, t.shape)}) for t in card.outputs]
        update.update(inputs=tensors, outputs=outputs)
    if "dtype" in changes:
        update["inputs"] = [t.model_copy(update={"dtype": changes["dtype"]}) for t in card.inputs]
        update["outputs"] = [t.model_copy(update={"dtype": changes["dtype"]}) for t in card.outputs]
    if "call_args" in changes:
        assert card.call is not None
        args = [a.model_copy(update={"value": changes["call_args"].get(a.path, a.value)}) for a in card.call.args]
        update["call"] = card.call.model_copy(update={"args": args})
    if "call" in changes:
        update["call"] = changes["call"]
    return card.model_copy(update=update)


def test_channels_last_cards_are_served_and_the_others_told_why() -> None:
    assert isinstance(template_for(STRIDED), ConvIgemmTemplate) and TEMPLATE.unsupported(DIFFUSION) is None
    nchw = {"x": ["n", "c", "h", "w"], "weight": ["o", "cg", "kh", "kw"], "y": ["n", "o", "oh", "ow"]}
    refusals = {
        "convert the model with .to(memory_format=torch.channels_last)": {"dims": nchw},
        "groups 2: the implicit GEMM here computes one group": {"sizes": {"groups": 2, "cg": 256}},
        "c = 20 channels is not a multiple of 8": {"sizes": {"c": 20, "cg": 20}},
        "o = 100 channels is not a multiple of 8": {"sizes": {"o": 100}},
        "tensor cores take one of ['bfloat16', 'float16'] here, card has ['float32']": {"dtype": "float32"},
        "the card records no aten.convolution call": {"call": None},
        "stride 2 in the recorded call: expects two integers": {"call_args": {"args[3]": 2}},
        "a 33x3 filter": {"sizes": {"kh": 33}},
    }
    for message, change in refusals.items():
        assert message in str(TEMPLATE.unsupported(changed(DIFFUSION, **change))), change
    too_big = changed(DIFFUSION, sizes={"n": 256})  # 256 x 64 x 64 x 512 bf16 = 1 GiB in, 1 GiB out
    assert "2 GiB or more" in str(TEMPLATE.unsupported(changed(too_big, sizes={"n": 512})))
    assert TEMPLATE.unsupported(too_big) is None


def test_a_render_reads_the_geometry_from_the_call_and_sizes_its_launch() -> None:
    source, plan = TEMPLATE.render(STRIDED, BASE)
    for define in ("STRIDE_H 2", "STRIDE_W 2", "PAD_H 1", "DILATION_W 1", "OUT_H 28", "CHANNELS 128", "HAS_BIAS 0"):
        assert f"#define {define}\n" in source, define
    assert plan.args == ["x", "weight", "y"]
    assert plan.block == [128] and plan.shared_bytes == 3 * (128 + 128) * 64 * 2
    assert plan.grid == [32 * 28 * 28 // 128, 1, 1]  # M = n * oh * ow pixels in tiles of 128, N = 128 channels
    dilated = changed(DIFFUSION, call_args={"args[5]": [2, 3]}, sizes={"oh": 62, "ow": 60})
    assert "#define DILATION_H 2\n#define DILATION_W 3\n" in TEMPLATE.render(dilated, BASE)[0]
    # tiles along N run in groups of 2^k (CUTLASS's identity swizzle): 512 channels = 4 tiles, a swizzle of 4
    _, swizzled = TEMPLATE.render(DIFFUSION, BASE.but(swizzle=4))
    assert swizzled.grid == [4 * 64 * 64 * 4 // 128, 1, 1]
    _, tails = TEMPLATE.render(TAILS, BASE.but(tile_m=64, tile_n=64, warp_m=32, warp_n=32))
    assert tails.args == ["x", "weight", "bias", "y"] and tails.grid == [-(-3 * 19 * 21 // 64), 2, 1]
    allowed = DEFAULT_ALLOWED_INCLUDES | {"cute/*", "cutlass/*"}
    launch = resolve(plan, STRIDED)
    assert [p for p in check_source(source, "kf_conv", allowed, launch.args) if p.severity == "error"] == []


def test_the_rules() -> None:
    problems = {
        "warp tiles 64x64 do not divide the 128x32 tile": BASE.but(tile_n=32),
        "16 warps a block": BASE.but(tile_m=256, tile_n=256),
        "1 warps a block": BASE.but(tile_m=64, tile_n=64),
        "6 stages take 294912 bytes": BASE.but(tile_m=256, stages=6),
    }
    for message, params in problems.items():
        assert message in str(TEMPLATE.problem(DIFFUSION, params)), params
    seeds = TemplateProposer().seeds(STRIDED)
    assert len(seeds) == 5 and all(s.plan.entry == "kf_conv" for s in seeds)


@needs_nvcc
def test_renders_build_for_sm90_in_the_sandbox_without_spills(sm90_builder: Builder) -> None:
    """The strided ResNet case's first seed, and the tails case with a bias in the small tile (~15 s of nvcc)."""
    chosen = [(STRIDED, TemplateProposer().seeds(STRIDED)[0]), (TAILS, TemplateProposer().seeds(TAILS)[3])]
    assert chosen[1][1].params["tile_m"] == 64
    assert build_problems(sm90_builder, chosen) == []
