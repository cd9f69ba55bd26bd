"""Hopper convolutions as implicit GEMMs through CUTLASS 3.x: y = conv2d(x, weight) (+ bias), stride 1, bf16 or fp16,
fp32 sums on wgmma.

Convention: conv_igemm.py's (channels-last x [n, h, w, c], weight [o, kh, kw, cg], y [n, oh, ow, o], the geometry
from the card's recorded call). The kernel is gemm_sm90's (cuda/gemm_sm90.cu rendered with `conv`): CUTLASS's sm90
warp-specialised wgmma mainloop, the persistent tile scheduler and the direct-store epilogue, over M = n * oh * ow
output pixels, N = o and K = kh * kw * c, with a TMA producer of its own (cuda/conv_sm90_maps.cuh). A K tile is
`tile_k` channels of one filter tap (r, s). Its A tile is `count` 4-d boxes of the input, each (tile_k channels,
w columns, h rows, n images) at its run of the tile's output pixels shifted by the tap, less the padding: a box is
whole output rows or a part of one, so its rows land in shared memory in the tile's order, and what the padding
puts outside the input (or a tile past the last pixel) the TMA reads as zeros. Its B tile is the filter's box
(tile_k channels, the tap, tile_n output channels). The harness encodes both maps over x and weight themselves
(cards.plan.tensor_map).

Why not CUTLASS's own sm90 convolution: its im2col TMA mode needs a map the driver's cuTensorMapEncodeIm2col
encodes, which the harness does not; the tiled maps here need nothing the GEMM's do not.

What it does not handle is refused here, never run: a stride other than 1 (a tile's pixels would not be one box),
groups, channels c not a multiple of 32 (a K tile must be one tap's) or o not a multiple of 8, and an output whose
tiles would take boxes of fewer than 8 pixels (ow and the tile sharing no factor of 8) or more than 16 copies of
the input a K tile. The seeds keep the tiles that fit; the search's others are refused by `problem`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from kernelforge_tui.build.cutlass_headers import cutlass_problem
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard, TensorMapSpec
from kernelforge_tui.proposers.templates.common import (
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtypes_problem,
)
from kernelforge_tui.proposers.templates.conv_igemm import Geometry, geometry_of
from kernelforge_tui.proposers.templates.gemm_sm90 import (
    ELEMENT_BYTES,
    ELEMENTS,
    L2_PROMOTION,
    SHARED_BYTES,
    THREADS,
    GemmLayout,
    GemmParams,
    GemmSm90Template,
    kernel_values,
    persistent_grid,
)
from kernelforge_tui.proposers.templates.source import render

SWIZZLE_ATOM_ROWS = 8
"""Rows of shared memory one swizzle pattern spans: each box of a tile starts on one."""
MAX_BOXES = 16
"""TMA copies of the input a K tile may take (one thread issues them all)."""
MIN_CHANNEL_TILE = 32
"""The narrowest K tile (a 64-byte swizzled row): c must be a multiple of it, so that a K tile is one tap's."""
OUTPUT_ALIGNMENT = 8
"""Output channels of one 16-byte row of the filter's map and of the epilogue's stores."""
TILE_MS = (64, 128, 256)
"""Output pixels a tile takes (wgmma's M, by warp groups of 64)."""


class ConvSm90Params(TemplateParams):
    tile_m: int
    tile_n: int
    tile_k: int
    schedule: Literal["cooperative", "pingpong"]
    swizzle: int


class Box(TemplateParams):
    """One TMA box of an A tile: columns, rows and images of the input (innermost first after the channels), and how
    many such boxes make the tile."""

    w: int
    h: int
    n: int
    count: int

    @property
    def pixels(self) -> int:
        return self.w * self.h * self.n


def box_split(sizes: dict[str, int], tile_m: int) -> Box:
    """The widest box of whole output rows (or of a part of one) that `tile_m` pixels split into evenly."""
    ow, oh = sizes["ow"], sizes["oh"]
    width = math.gcd(ow, tile_m)
    if width < ow:
        return Box(w=width, h=1, n=1, count=tile_m // width)
    rows = tile_m // ow
    height = math.gcd(oh, rows)
    images = 1 if height < oh else rows // oh
    return Box(w=ow, h=height, n=images, count=tile_m // (ow * height * images))


def box_problem(box: Box) -> str | None:
    """Why the producer cannot copy a tile as these boxes, or None."""
    if box.pixels % SWIZZLE_ATOM_ROWS:
        return f"boxes of {box.pixels} pixels, which would start inside a swizzle atom ({SWIZZLE_ATOM_ROWS} rows)"
    if box.count > MAX_BOXES:
        return f"more than {MAX_BOXES} boxes of the input"
    return None


def box_of(sizes: dict[str, int], tile_m: int) -> Box | None:
    """`box_split`'s boxes, or None where a box would not start on a swizzle atom (8 rows of shared memory) or a
    tile would take over MAX_BOXES."""
    box = box_split(sizes, tile_m)
    return None if box_problem(box) else box


def shape_problem(card: OperatorCard, geometry: Geometry) -> str | None:
    """Why the card's convolution is not one this kernel computes, or None."""
    sizes = card.sizes
    if geometry.stride != (1, 1):
        return f"stride {list(geometry.stride)}: a box of the input is a run of output pixels only at stride 1"
    if sizes["groups"] != 1:
        return f"groups {sizes['groups']}: the implicit GEMM here computes one group"
    if sizes["c"] % MIN_CHANNEL_TILE:
        return f"c = {sizes['c']} channels is not a multiple of {MIN_CHANNEL_TILE} (a K tile is one filter tap's)"
    if sizes["o"] % OUTPUT_ALIGNMENT:
        return f"o = {sizes['o']} output channels is not a multiple of {OUTPUT_ALIGNMENT} (16-byte rows)"
    if not any(box_of(sizes, tile_m) for tile_m in TILE_MS):
        return (
            f"{sizes['oh']}x{sizes['ow']} output images: no tile of {', '.join(map(str, TILE_MS[:-1]))} or "
            f"{TILE_MS[-1]} pixels splits into at most "
            f"{MAX_BOXES} boxes of whole rows or of runs of 8k pixels"
        )
    return None


def gemm_params(params: ConvSm90Params) -> GemmParams:
    """The GEMM configuration the kernel is: TMA, no cluster (the A box is not split for multicast)."""
    return GemmParams(
        tile_m=params.tile_m,
        tile_n=params.tile_n,
        tile_k=params.tile_k,
        schedule=params.schedule,
        swizzle=params.swizzle,
        mainloop="tma",
        cluster_m=1,
        cluster_n=1,
    )


class ConvSm90Template(Template[ConvSm90Params]):
    name = "conv_sm90"
    families = ("convolution",)
    entry = "kf_conv"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("tile_m", "up", "bigger tiles: each filter element read fewer times"),
            Lever("tile_n", "up", "bigger tiles: each input element read fewer times"),
            Lever("swizzle", "up", "neighbouring tiles share the input in L2"),
        ),
        "memory_latency": (
            Lever("tile_k", "down", "more stages in flight"),
            Lever("schedule", "any", "one consumer's epilogue under the other's mainloop"),
        ),
        "compute": (
            Lever("tile_n", "up", "wider wgmma per shared tile"),
            Lever("tile_m", "any", "tiles against waves of SMs"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        geometry = geometry_of(card)
        if isinstance(geometry, str):
            return geometry
        return dtypes_problem(card, ELEMENTS, "wgmma takes") or cutlass_problem() or shape_problem(card, geometry)

    def space(self, card: OperatorCard) -> Space:
        return {
            "tile_m": TILE_MS,
            "tile_n": (64, 128, 256),
            "tile_k": (32, 64),
            "schedule": ("cooperative", "pingpong"),
            "swizzle": (1, 2, 4, 8),
        }

    def params_type(self, card: OperatorCard) -> type[ConvSm90Params]:
        return ConvSm90Params

    def problem(self, card: OperatorCard, params: ConvSm90Params) -> str | None:
        if card.sizes["c"] % params.tile_k:
            return f"c = {card.sizes['c']} is not a multiple of tile_k {params.tile_k}: a K tile is one tap's channels"
        why = box_problem(box_split(card.sizes, params.tile_m))
        if why is not None:
            return f"a tile of {params.tile_m} pixels of the {card.sizes['oh']}x{card.sizes['ow']} output takes {why}"
        return GemmSm90Template().problem(card, gemm_params(params))

    def render(self, card: OperatorCard, params: ConvSm90Params) -> tuple[str, LaunchPlan]:
        geometry = geometry_of(card)
        assert not isinstance(geometry, str), geometry
        box = box_of(card.sizes, params.tile_m)
        assert box is not None, "problem() refuses tiles that take too many boxes"
        sizes = card.sizes
        gemm = gemm_params(params)
        # the GEMM it is: a [M, K] row-major (pixels by taps and channels), b [N, K] (the filter, K-major)
        layout = GemmLayout(a_row_major=True, b_row_major=False, batched=False, bias=geometry.bias, activation="")
        what = (
            f"y = conv2d(x, weight){' + bias' if geometry.bias else ''}, {sizes['kh']}x{sizes['kw']} filter, stride 1, "
            f"padding {list(geometry.padding)}, dilation {list(geometry.dilation)}, channels-last, as an implicit GEMM"
        )
        source = render(
            "gemm_sm90.cu",
            **kernel_values(card, layout, gemm, self.entry, what),
            conv=True,
            channels=sizes["c"],
            filter_w=sizes["kw"],
            out_h=sizes["oh"],
            out_w=sizes["ow"],
            padding_h=geometry.padding[0],
            padding_w=geometry.padding[1],
            dilation_h=geometry.dilation[0],
            dilation_w=geometry.dilation[1],
            box_w=box.w,
            box_h=box.h,
            box_n=box.n,
            boxes=box.count,
        )
        swizzle = params.tile_k * ELEMENT_BYTES
        maps = {
            "map_x": TensorMapSpec(
                tensor="x", box=[params.tile_k, box.w, box.h, box.n], swizzle=swizzle, l2_promotion=L2_PROMOTION
            ),
            "map_weight": TensorMapSpec(
                tensor="weight", box=[params.tile_k, 1, 1, params.tile_n], swizzle=swizzle, l2_promotion=L2_PROMOTION
            ),
        }
        m, n, k = "n * oh * ow", "o", "kh * kw * c"
        plan = LaunchPlan(
            entry=self.entry,
            grid=persistent_grid(gemm, m, n, "1"),
            block=[THREADS],
            shared_bytes=SHARED_BYTES,
            args=[*maps, *(["bias"] if geometry.bias else []), "y", m, n, k, "1"],
            tensor_maps=maps,
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """gemm_sm90's first picks that tile the card's output (128x256 and 128x128 cooperative, 64x128 and 128x128
        pingpong, 64-channel K tiles where c allows), then the narrower K tile."""
        tile_k = 64 if card.sizes["c"] % 64 == 0 else 32
        seeds: list[Params] = [
            {"tile_m": 128, "tile_n": 256, "tile_k": tile_k, "schedule": "cooperative", "swizzle": 1},
            {"tile_m": 128, "tile_n": 128, "tile_k": tile_k, "schedule": "cooperative", "swizzle": 1},
            {"tile_m": 128, "tile_n": 128, "tile_k": tile_k, "schedule": "pingpong", "swizzle": 1},
            {"tile_m": 64, "tile_n": 128, "tile_k": tile_k, "schedule": "pingpong", "swizzle": 1},
            {"tile_m": 256, "tile_n": 128, "tile_k": tile_k, "schedule": "cooperative", "swizzle": 1},
            {"tile_m": 128, "tile_n": 256, "tile_k": 32, "schedule": "cooperative", "swizzle": 1},
        ]
        return [s for s in seeds if box_of(card.sizes, int(s["tile_m"])) is not None]
