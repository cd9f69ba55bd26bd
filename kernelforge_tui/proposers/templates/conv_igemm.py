"""Convolutions as implicit GEMMs on tensor cores, through CUTLASS 2.x: y = conv2d(x, weight) (+ bias), bf16 or fp16.

Convention (the cards `kernelforge capture` makes of aten.convolution, capture/families.py): inputs `x`, `weight` and
optionally `bias` [o], output `y`; sizes n, c, h, w, o, cg, kh, kw, oh, ow and groups; the stride, padding and
dilation the call passed, read from the card's recorded call (`[call]`, args[3] to args[5]). Every tensor as it lay
in memory: this template serves channels-last ones, x [n, h, w, c], weight [o, kh, kw, cg] and y [n, oh, ow, o]
(a model in `memory_format=torch.channels_last`), which is the layout an implicit GEMM reads in 16-byte runs of
channels; an NCHW card is refused with that reason (the direct convolution template serves the suite's NCHW ones).

The kernel (cuda/conv_igemm.cu) is CUTLASS's DefaultConv2dFprop for sm80 tensor ops (it runs on Hopper as it is):
M = n * oh * ow output pixels, N = o output channels, K = kh * kw * c, a `tile_m` x `tile_n` x `tile_k` tile per
block split among `warp_m` x `warp_n` warp tiles, `stages` cp.async stages, and CUTLASS's identity tile swizzle
(`swizzle`: that many neighbouring tiles along N run together, for L2 reuse of the activations). The optimized fprop
iterators handle any stride, padding and dilation and the tails of M and N; the padding reads as zeros.

What it does not handle is refused here, never run: groups other than 1, channels c or o not a multiple of 8 (each
copy moves 8 channels), filters wider than 32 taps (the iterator's mask bits), tensors of 2 GiB or more (32-bit
offsets), fp32 (the matmul template's; TF32 would fail an fp32 card's tolerance) and 1-d convolutions.
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.build.cutlass_headers import cutlass_problem, find_cutlass
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    MAX_DYNAMIC_SHARED,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    call_scalars,
    dtype_of,
    dtypes_problem,
)
from kernelforge_tui.proposers.templates.source import render

ELEMENTS = {"bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t"}
ALIGNMENT = 8
"""Channels of one 16-byte cp.async copy: c and o are multiples of it."""
ELEMENT_BYTES = 2
MAX_TAPS = 32
"""The optimized fprop iterator's mask bits per filter dim (kh and kw)."""
MAX_TENSOR_BYTES = 2**31
"""CUTLASS 2.x conv addresses each tensor with 32-bit offsets (device::ImplicitGemmConvolution::can_implement)."""
MAX_ACCUMULATORS = 128
"""fp32 accumulators per thread (a 64x64 warp tile): more spill."""
CHANNELS_LAST = {"x": ["n", "h", "w", "c"], "weight": ["o", "kh", "kw", "cg"], "y": ["n", "oh", "ow", "o"]}
SIZES = ("n", "c", "h", "w", "o", "cg", "kh", "kw", "oh", "ow", "groups")
GEOMETRY = {"stride": "args[3]", "padding": "args[4]", "dilation": "args[5]"}
"""aten.convolution's arguments this template reads from the card's recorded call."""


class ConvParams(TemplateParams):
    tile_m: int
    tile_n: int
    tile_k: int
    warp_m: int
    warp_n: int
    stages: int
    swizzle: int


class Geometry(TemplateParams):
    """The call's stride, padding and dilation, (height, width) each, and whether it has a bias (from the card)."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    bias: bool


def geometry_of(card: OperatorCard) -> Geometry | str:
    """The card's convolution geometry, or why this template cannot serve the card (in words for `unsupported`)."""
    names = [t.name for t in card.inputs]
    if names not in (["x", "weight"], ["x", "weight", "bias"]) or [t.name for t in card.outputs] != ["y"]:
        return f"expects inputs x, weight (, bias) and output y, card has {names} -> {[t.name for t in card.outputs]}"
    missing = [s for s in SIZES if s not in card.sizes]
    if missing:
        return f"card lacks sizes {missing} (a 2-d convolution captured from aten.convolution has them)"
    for tensor in (*card.inputs[:2], card.outputs[0]):
        if tensor.shape != CHANNELS_LAST[tensor.name]:
            return (
                f"{tensor.name} lies as {tensor.shape}: the implicit GEMM reads channels-last tensors "
                f"({CHANNELS_LAST[tensor.name]}); convert the model with .to(memory_format=torch.channels_last)"
            )
    passed = call_scalars(card, "aten.convolution.default", "its stride, padding and dilation")
    if isinstance(passed, str):
        return passed
    pairs: dict[str, tuple[int, int]] = {}
    for name, path in GEOMETRY.items():
        value = passed.get(path)
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)):
            return f"{name} {value!r} in the recorded call: expects two integers"
        pairs[name] = (int(value[0]), int(value[1]))
    return Geometry(**pairs, bias=len(card.inputs) == 3)


def shape_problem(card: OperatorCard) -> str | None:
    """Why CUTLASS's optimized fprop cannot take the card's sizes, or None."""
    sizes = card.sizes
    if sizes["groups"] != 1:
        return f"groups {sizes['groups']}: the implicit GEMM here computes one group"
    for name in ("c", "o"):
        if sizes[name] % ALIGNMENT:
            return f"{name} = {sizes[name]} channels is not a multiple of {ALIGNMENT} (16-byte copies of channels)"
    if max(sizes["kh"], sizes["kw"]) > MAX_TAPS:
        return f"a {sizes['kh']}x{sizes['kw']} filter: CUTLASS's optimized iterator takes up to {MAX_TAPS} taps a dim"
    for tensor in (*card.inputs, *card.outputs):
        if tensor.numel(sizes) * ELEMENT_BYTES >= MAX_TENSOR_BYTES:
            return f"{tensor.name} takes 2 GiB or more: CUTLASS 2.x convolutions address tensors with 32-bit offsets"
    return None


def swizzle_log(tiles_n: int, swizzle: int) -> int:
    """log2 of the tiles along N that run together: GemmIdentityThreadblockSwizzle<swizzle>::get_log_tile."""
    for width, log in ((8, 3), (4, 2), (2, 1)):
        if swizzle >= width and tiles_n >= {8: 6, 4: 3, 2: 2}[width]:
            return log
    return 0


def shared_bytes(params: ConvParams) -> int:
    """The multistage mainloop's ring: every stage a tile_m x tile_k activation and tile_k x tile_n filter tile (the
    epilogue reuses it; the kernel asserts its storage fits)."""
    return params.stages * (params.tile_m + params.tile_n) * params.tile_k * ELEMENT_BYTES


class ConvIgemmTemplate(Template[ConvParams]):
    name = "conv_igemm"
    families = ("convolution",)
    entry = "kf_conv"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("tile_m", "up", "bigger tiles: each filter element read fewer times"),
            Lever("tile_n", "up", "bigger tiles: each activation read fewer times"),
            Lever("swizzle", "up", "neighbouring tiles share the activations in L2"),
        ),
        "memory_latency": (
            Lever("stages", "up", "more copies in flight"),
            Lever("tile_k", "down", "more stages fit"),
        ),
        "compute": (
            Lever("warp_n", "up", "more mma per shared fragment"),
            Lever("warp_m", "up", "more mma per shared fragment"),
            Lever("tile_m", "any", "tiles against waves of SMs"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        geometry = geometry_of(card)
        if isinstance(geometry, str):
            return geometry
        return dtypes_problem(card, ELEMENTS, "tensor cores take") or cutlass_problem() or shape_problem(card)

    def space(self, card: OperatorCard) -> Space:
        return {
            "tile_m": (64, 128, 256),
            "tile_n": (64, 128, 256),
            "tile_k": (32, 64),
            "warp_m": (32, 64),
            "warp_n": (32, 64),
            "stages": (3, 4, 5, 6),
            "swizzle": (1, 2, 4, 8),
        }

    def params_type(self, card: OperatorCard) -> type[ConvParams]:
        return ConvParams

    def problem(self, card: OperatorCard, params: ConvParams) -> str | None:
        if params.tile_m % params.warp_m or params.tile_n % params.warp_n:
            return f"warp tiles {params.warp_m}x{params.warp_n} do not divide the {params.tile_m}x{params.tile_n} tile"
        warps = params.tile_m // params.warp_m * (params.tile_n // params.warp_n)
        if not 2 <= warps <= 8:
            return f"{warps} warps a block: 2 to 8 here"
        accumulators = params.warp_m * params.warp_n // 32
        if accumulators > MAX_ACCUMULATORS:
            return f"{accumulators} fp32 accumulators per thread (at most {MAX_ACCUMULATORS})"
        if (taken := shared_bytes(params)) > MAX_DYNAMIC_SHARED:
            return f"{params.stages} stages take {taken} bytes, over {MAX_DYNAMIC_SHARED} of shared memory"
        return None

    def render(self, card: OperatorCard, params: ConvParams) -> tuple[str, LaunchPlan]:
        geometry = geometry_of(card)
        assert not isinstance(geometry, str), geometry
        headers = find_cutlass()
        assert headers is not None, "unsupported() refuses cards without the CUTLASS headers"
        sizes = card.sizes
        dtype = dtype_of(card)
        threads = 32 * (params.tile_m // params.warp_m) * (params.tile_n // params.warp_n)
        what = (
            f"y = conv2d(x, weight){' + bias' if geometry.bias else ''}, {sizes['kh']}x{sizes['kw']} filter, stride "
            f"{list(geometry.stride)}, padding {list(geometry.padding)}, dilation {list(geometry.dilation)}, "
            "channels-last"
        )
        source = render(
            "conv_igemm.cu",
            what=what,
            dtype=dtype,
            cutlass_version=headers.version,
            element=ELEMENTS[dtype],
            threads=threads,
            shared_bytes=shared_bytes(params),
            has_bias=int(geometry.bias),
            pad_h=geometry.padding[0],
            pad_w=geometry.padding[1],
            stride_h=geometry.stride[0],
            stride_w=geometry.stride[1],
            dilation_h=geometry.dilation[0],
            dilation_w=geometry.dilation[1],
            **params.as_dict(),
            **{name: sizes[name] for name in ("n", "c", "h", "w", "o", "kh", "kw", "oh", "ow")},
        )
        tiles_m = -(-sizes["n"] * sizes["oh"] * sizes["ow"] // params.tile_m)
        tiles_n = -(-sizes["o"] // params.tile_n)
        log = swizzle_log(tiles_n, params.swizzle)
        plan = LaunchPlan(
            entry=self.entry,
            grid=[tiles_m << log, -(-tiles_n // (1 << log)), 1],
            block=[threads],
            shared_bytes=shared_bytes(params),
            args=["x", "weight", *(["bias"] if geometry.bias else []), "y"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """CUTLASS's usual sm80 bf16 fprop picks: 128x128x64 in four 64x64 warps with 3 stages, then a 128x256 tile
        (eight warps) for wide layers, a 256x128 one for many pixels, 64x64 with 5 stages for small layers (more
        blocks than SMs) and 128x128x32 with 5 stages (more copies in flight)."""
        base: Params = {
            "tile_m": 128,
            "tile_n": 128,
            "tile_k": 64,
            "warp_m": 64,
            "warp_n": 64,
            "stages": 3,
            "swizzle": 1,
        }
        return [
            base,
            {**base, "tile_n": 256},
            {**base, "tile_m": 256},
            {**base, "tile_m": 64, "tile_n": 64, "warp_m": 32, "warp_n": 32, "stages": 5},
            {**base, "tile_k": 32, "stages": 5},
        ]
