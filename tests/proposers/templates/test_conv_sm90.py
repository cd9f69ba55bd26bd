"""The Hopper implicit-GEMM convolution template (gemm_sm90's kernel with a TMA producer of its own): which captured
convolution cards it serves and why not the others, how a tile of output pixels splits into boxes of the input, the
maps its plan asks the harness for, and one real sandboxed nvcc build of a render (sm_90a, the `cutlass` extra's
headers). The kernels run on the H200 in bench/conv_cutlass.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.conv_cutlass import CASES, card_of
from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.build.source_policy import DEFAULT_ALLOWED_INCLUDES
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.conv_igemm import ConvIgemmTemplate
from kernelforge_tui.proposers.templates.conv_sm90 import Box, ConvSm90Params, ConvSm90Template, box_of
from kernelforge_tui.proposers.templates.source import CUDA
from tests.proposers.templates.test_conv_igemm import changed
from tests.support.cuda_emulator import build
from tests.support.cutlass_marks import needs_cutlass
from tests.support.nvcc_marks import needs_nvcc
from tests.support.seed_builds import build_problems

pytestmark = [needs_cutlass, pytest.mark.xdist_group(__name__)]
TEMPLATE = ConvSm90Template()
BY_NAME = {case["name"]: case for case in CASES}
DIFFUSION = card_of(BY_NAME["diffusion_3x3"])
RESNET = card_of(BY_NAME["resnet_s1_3x3"])
BASE = ConvSm90Params(tile_m=128, tile_n=256, tile_k=64, schedule="cooperative", swizzle=1)


def test_stride_1_cards_are_served_here_and_the_others_by_cutlass_2x_or_told_why() -> None:
    assert isinstance(template_for(DIFFUSION), ConvSm90Template)
    assert isinstance(template_for(RESNET), ConvSm90Template)
    strided = BY_NAME["resnet_s2_3x3_stride2"]
    assert isinstance(template_for(card_of(strided)), ConvIgemmTemplate)
    refusals = {
        "stride [2, 2]: a box of the input is a run of output pixels only at stride 1": strided,
        "c = 40 channels is not a multiple of 32": BY_NAME["tails"],
        "28x28 output images: no tile of 64, 128 or 256 pixels": BY_NAME["resnet_s2_3x3"],
    }
    for message, case in refusals.items():
        assert message in str(TEMPLATE.unsupported(card_of(case))), case["name"]
    assert "o = 100 output channels" in str(TEMPLATE.unsupported(changed(DIFFUSION, sizes={"o": 100})))
    assert "groups 2" in str(TEMPLATE.unsupported(changed(DIFFUSION, sizes={"groups": 2, "cg": 256})))


def test_a_tile_of_pixels_splits_into_boxes_of_whole_rows_or_runs_of_a_row() -> None:
    def sizes(n: int, oh: int, ow: int) -> dict[str, int]:
        return {"n": n, "oh": oh, "ow": ow}

    assert box_of(sizes(4, 64, 64), 128) == Box(w=64, h=2, n=1, count=1)  # two whole rows
    assert box_of(sizes(4, 64, 64), 64) == Box(w=64, h=1, n=1, count=1)
    assert box_of(sizes(2, 8, 8), 128) == Box(w=8, h=8, n=2, count=1)  # two whole 8x8 images
    assert box_of(sizes(2, 6, 16), 128) == Box(w=16, h=2, n=1, count=4)  # 8 rows of 6-row images: 2 rows a box
    assert box_of(sizes(32, 56, 56), 128) == Box(w=8, h=1, n=1, count=16)  # runs of 8 of a 56-wide row
    assert box_of(sizes(32, 56, 56), 256) is None  # 32 boxes of 8
    assert box_of(sizes(32, 28, 28), 64) is None  # runs of 4: a box would start inside a swizzle atom
    assert box_of(sizes(1, 7, 7), 128) is None


def test_a_render_asks_for_maps_of_x_and_the_filter_in_the_tiles_boxes() -> None:
    source, plan = TEMPLATE.render(RESNET, BASE.but(tile_n=128))
    launch = resolve(plan, RESNET)
    passed = [("tensor_map", "x"), ("tensor_map", "weight"), ("tensor", "y")]
    assert [(a.kind, a.name) for a in launch.args][:3] == passed
    x, weight = (a.tensor_map for a in launch.args[:2])
    assert x is not None and weight is not None
    assert x.dims == (64, 56, 56, 32) and x.box == (64, 8, 1, 1)  # (c, w, h, n): 16 runs of 8 pixels a tile
    assert weight.dims == (64, 3, 3, 64) and weight.box == (64, 1, 1, 128)  # (c, kw, kh, o): one tap's channels
    assert [a.value for a in launch.args[3:]] == [32 * 56 * 56, 64, 3 * 3 * 64, 1]  # M, N, K, one batch
    assert launch.grid == (min(-(-32 * 56 * 56 // 128), 132), 1, 1)
    for define in ("BOX_W 8", "BOX_H 1", "BOXES 16", "CHANNELS 64", "OUT_W 56", "PADDING_H 1", "HAS_BIAS 0"):
        assert f"#define {define}\n" in source, define
    assert "ConvMapsMainloop<BuiltMainloop>" in source and "HarnessMapsMainloop" not in source
    allowed = DEFAULT_ALLOWED_INCLUDES | {"cute/*", "cutlass/*"}
    assert [p for p in check_source(source, "kf_conv", allowed, launch.args) if p.severity == "error"] == []


def test_the_rules() -> None:
    problems = {
        "c = 64 is not a multiple of tile_k 128": (RESNET, BASE.but(tile_k=128)),
        "a tile of 256 pixels of the 56x56 output takes more than 16 boxes": (RESNET, BASE.but(tile_m=256, tile_n=64)),
        "a tile of 64 pixels of the 28x28 output takes boxes of 4 pixels, which would start inside a swizzle atom": (
            card_of(BY_NAME["resnet_s2_3x3"]),
            BASE.but(tile_m=64, tile_n=64, schedule="pingpong"),
        ),
        "a cooperative tile splits its 64 rows over two warp groups": (DIFFUSION, BASE.but(tile_m=64)),
        "256 fp32 accumulators per consumer thread": (DIFFUSION, BASE.but(tile_m=256)),
    }
    for message, (card, params) in problems.items():
        assert message in str(TEMPLATE.problem(card, params)), params
    seeds = TemplateProposer().seeds(RESNET)
    assert seeds and all(s.plan.entry == "kf_conv" and "tensor_maps" in s.plan.model_dump() for s in seeds)
    assert {s.params["tile_k"] for s in TemplateProposer().seeds(changed(DIFFUSION, sizes={"c": 96, "cg": 96}))} == {32}


@needs_nvcc
def test_a_render_builds_for_sm90a_in_the_sandbox_without_spills(cubin_cache: Path) -> None:
    """A pingpong ResNet seed, 16 boxes a K tile: the producer's most copies, where an unrolled box loop spilled
    (~12 s of nvcc; the one-box renders share all else)."""
    builder = Builder(arch="sm_90", cache_dir=cubin_cache, timeout_s=300)
    pingpong = next(s for s in TemplateProposer().seeds(RESNET) if s.params["schedule"] == "pingpong")
    assert "#define BOXES 16\n" in pingpong.source
    assert build_problems(builder, [(RESNET, pingpong)]) == []


HOST_CHECK = Path(__file__).parents[2] / "support" / "cuda" / "conv_boxes_host.cpp"
DEFINE = re.compile(r"^#define (\w+) (-?\d+)$", re.MULTILINE)


def geometry(name: str, n: int, c: int, hw: int, o: int, **call: Any) -> Any:
    """A stride-1 3x3 card of the bench's kind, hw x hw (or `h` rows); `pad` and `dilation` change its recorded
    call and output size."""
    pad, dilation, h = call.get("pad", 1), call.get("dilation", 1), call.get("h", hw)
    card = card_of({"name": name, "n": n, "c": c, "h": h, "w": hw, "o": o, "k": 3, "stride": 1, "pad": pad})
    grown = 2 * pad - 2 * dilation
    return changed(card, call_args={"args[5]": [dilation, dilation]}, sizes={"oh": h + grown, "ow": hw + grown})


HOST_CASES = {
    "one box of two rows": (geometry("rows", 2, 64, 64, 64), BASE),
    "16 runs of 8, a tail tile": (geometry("runs", 1, 64, 56, 64), BASE.but(tile_n=128)),
    "boxes of two images, a tile past the last": (geometry("images", 3, 32, 8, 64), BASE.but(tile_k=32)),
    "four boxes of two rows": (geometry("row_pairs", 2, 32, 16, 64, h=6), BASE.but(tile_k=32)),
    "padding 2, dilation 2": (geometry("dilated", 2, 32, 16, 64, pad=2, dilation=2), BASE.but(tile_k=32)),
    "a 64-pixel tile": (geometry("small_tile", 2, 64, 24, 64), BASE.but(tile_m=64, schedule="pingpong", tile_n=128)),
}


def test_every_tile_the_producer_copies_holds_the_im2col_of_its_pixels(tmp_path: Path) -> None:
    """The producer's box arithmetic (cuda/conv_sm90_boxes.cuh, the text the render pastes, with the render's own
    constants) on the host, each box read as a tiled TMA box reads (zeros outside the tensor), against the
    convolution's im2col, and the filter's box against its [o, K] rows in the same K order
    (tests/support/cuda/conv_boxes_host.cpp)."""
    boxes = CUDA.render("conv_sm90_boxes.cuh")
    programs = {}
    for number, (card, params) in enumerate(HOST_CASES.values()):
        assert TEMPLATE.problem(card, params) is None, params
        source, _ = TEMPLATE.render(card, params)
        constants = dict(DEFINE.findall(source))
        sizes = {f"CARD_{k.upper()}": card.sizes[k] for k in ("n", "h", "w", "kh", "o")}
        defines = "".join(f"#define {k} {v}\n" for k, v in {**constants, **sizes}.items())
        assert boxes in source  # the arithmetic checked is the kernel's
        programs[f"case_{number}"] = defines + HOST_CHECK.read_text().replace('#include "boxes.cuh"', boxes)
    build(tmp_path, programs)
    for number, name in enumerate(HOST_CASES):
        ran = subprocess.run([str(tmp_path / f"case_{number}")], capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, (name, ran.stdout, ran.stderr)
        assert "tiles checked" in ran.stdout, name
