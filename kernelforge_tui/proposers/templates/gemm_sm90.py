"""Hopper matrix products through CUTLASS 3.x: y = act(a b + bias), bf16 or fp16 in and out, fp32 sums on wgmma.

Convention (the cards `kernelforge capture` makes of mm, addmm, bmm, baddbmm, linear and their chains): inputs `a`, `b`
and optionally `bias` [N], output `y`; sizes M, N, K and optionally `batch`. The operands keep the layout the model
gave them, and the card says which by the order of its dims: `a` is [M, K] (row-major) or [K, M] (a transposed view,
column-major to CUTLASS), `b` is [K, N] or [N, K] (nn.Linear's weight, read as b^T), each with a leading `batch` dim
on a batched card, `y` is [(batch,) M, N]. An activation fused after the bias is named in the card's name
(`addmm_gelu_...`, `mm_gelu_tanh_...`, `..._silu_...`, `..._relu_...`: capture's product chains). A baddbmm card
(inputs a, b and c, the added tensor in any of its broadcasts along batch and M) gives y = beta c + alpha a b, with
beta and alpha read from its recorded call (`[call]`); c is the epilogue's source at its own strides (0 along a
broadcast dim), not read where beta is 0 (as torch leaves it).

The kernel (cuda/gemm_sm90.cu) is CUTLASS's CollectiveBuilder sm90 warp-specialised mainloop, the persistent tile
scheduler and the direct-store epilogue, wrapped in an `extern "C"` entry that builds the kernel's Params on the
device from the plan's arguments. Its producer (`mainloop`) copies with TMA (`KernelTmaWarpSpecialized...`) through
tensor maps of a and b that the harness encodes from the plan's `tensor_maps` (`operand_maps` derives the box and
swizzle CUTLASS's make_tma_copy would build for the collective's shared layout; a test compares them with
CUTLASS's own host code) and passes by value; or with cp.async (`KernelCpAsyncWarpSpecialized...`, no maps).
Parameters: `tile_m` x `tile_n` x `tile_k` (the CTA tile; stages fill the shared memory CUTLASS's
StageCountAutoCarveout leaves), `schedule` (cooperative: two consumer warp groups split a tile; pingpong: they
alternate tiles, one's epilogue under the other's mainloop), `swizzle` (the scheduler's tile rasterisation swizzle,
for L2 reuse), `mainloop` and `cluster_m` x `cluster_n` (TMA only: a cluster of two CTAs along M shares each tile
of b by multicast, along N each tile of a).

What it does not handle is refused here, never run: fp32 (TF32 sums fail the fp32 tolerance; the matmul template
serves fp32), and an operand whose contiguous dim is not a multiple of 8 elements (cp.async copies 16 bytes, a TMA
map's strides are multiples of 16 bytes, and a batch's start must stay 16-byte aligned). M, N and K tails are
handled: the cp.async mainloop predicates its copies (zero fill), a TMA reads zeros outside its map, and the
epilogue predicates its stores, so K need not be a multiple of tile_k.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from kernelforge_tui.build.cutlass_headers import cutlass_problem, find_cutlass
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard, TensorMapSpec, TensorSpec
from kernelforge_tui.proposers.templates.common import (
    SM_COUNT,
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
from kernelforge_tui.proposers.templates.source import Value, render

ELEMENTS = {"bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t"}
ALIGNMENT = 8
"""Elements of one 16-byte cp.async copy: every operand's contiguous dim is a multiple of it."""
THREADS = 384
"""One producer and two consumer warp groups, in both schedules."""
SHARED_BYTES = 227 * 1024
"""What a Hopper block may take; CUTLASS's stage count fills it (the source asserts its storage fits)."""
MAX_ACCUMULATORS = 128
"""fp32 accumulators per consumer thread: a 128x256 cooperative or 64x256 pingpong tile; more spill."""
ACTIVATIONS = {"relu": "ReLu", "silu": "SiLu", "gelu": "GELU", "gelu_tanh": "GELU_taylor"}
"""Activation in a card's name -> CUTLASS's functor (cutlass/epilogue/thread/activation.h; GELU_taylor is the tanh
approximation, with tanh.approx)."""
SCHEDULES = {"cooperative": "Cooperative", "pingpong": "Pingpong"}
MAINLOOPS = {"tma": "KernelTmaWarpSpecialized", "cp_async": "KernelCpAsyncWarpSpecialized"}
BADDBMM_SCALARS = (("args[3]", "kwargs.beta"), ("args[4]", "kwargs.alpha"))
"""Where aten.baddbmm's beta and alpha lie in its recorded call (1 where it passed neither)."""
SWIZZLES = (128, 64, 32)
"""The shared-memory swizzle spans (bytes) of CUTLASS's Hopper smem layout atoms, widest first."""
ELEMENT_BYTES = 2
L2_PROMOTION = 128
"""What CUTLASS's make_tma_copy asks of the L2 (CU_TENSOR_MAP_L2_PROMOTION_L2_128B)."""


class GemmParams(TemplateParams):
    tile_m: int
    tile_n: int
    tile_k: int
    schedule: Literal["cooperative", "pingpong"]
    swizzle: int
    mainloop: Literal["tma", "cp_async"]
    cluster_m: int
    cluster_n: int


class Scaled(TemplateParams):
    """baddbmm's y = beta c + alpha a b: its scalars and c's strides (elements) between rows and batches, 0 along a
    broadcast dim."""

    beta: float
    alpha: float
    row_stride: int
    batch_stride: int


class GemmLayout(TemplateParams):
    """How a card's operands lie: its layouts, batch, bias and activation, and a baddbmm's c (read from the card,
    never searched)."""

    a_row_major: bool
    b_row_major: bool
    batched: bool
    bias: bool
    activation: str
    """"" or a key of ACTIVATIONS."""
    scaled: Scaled | None = None

    @property
    def reads_source(self) -> bool:
        """Whether the epilogue reads a source tensor: the bias, or baddbmm's c unless beta is 0."""
        return self.bias or (self.scaled is not None and self.scaled.beta != 0)


def scaled_of(card: OperatorCard, c: TensorSpec) -> Scaled | str:
    """A baddbmm card's scalars (from its recorded call) and c's strides, or why they cannot be served."""
    c_dims = [str(d) for d in c.shape]
    if c_dims[-1:] != ["N"]:
        return f"c has dims {c_dims}: the epilogue reads c along N (a c broadcast along N is not served)"
    step = dict(zip(c_dims, c.strides(card.sizes), strict=True))
    passed = call_scalars(card, "aten.baddbmm.default", "beta and alpha")
    if isinstance(passed, str):
        return passed
    beta, alpha = (next((passed[p] for p in paths if p in passed), 1) for paths in BADDBMM_SCALARS)
    numbers = [float(v) for v in (beta, alpha) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) != 2 or not all(map(math.isfinite, numbers)):
        return f"beta {beta!r}, alpha {alpha!r} in the recorded call: expects finite numbers"
    return Scaled(beta=numbers[0], alpha=numbers[1], row_stride=step.get("M", 0), batch_stride=step.get("batch", 0))


def layout_of(card: OperatorCard) -> GemmLayout | str:
    """The card's layout, or why it does not follow the convention (in words for `unsupported`)."""
    names = [t.name for t in card.inputs]
    if names not in (["a", "b"], ["a", "b", "bias"], ["a", "b", "c"]) or [t.name for t in card.outputs] != ["y"]:
        return f"expects inputs a, b (, bias or c) and output y, card has {names} -> {[t.name for t in card.outputs]}"
    batched = "batch" in card.sizes
    lead: list[str | int] = ["batch"] if batched else []
    a, b, *rest = card.inputs
    shapes = {
        "a": {tuple([*lead, "M", "K"]): True, tuple([*lead, "K", "M"]): False},
        "b": {tuple([*lead, "K", "N"]): True, tuple([*lead, "N", "K"]): False},
    }
    row_major: dict[str, bool] = {}
    for tensor in (a, b):
        found = shapes[tensor.name].get(tuple(tensor.shape))
        if found is None:
            return f"{tensor.name} has dims {tensor.shape}: expects one of {[list(s) for s in shapes[tensor.name]]}"
        row_major[tensor.name] = found
    if card.outputs[0].shape != [*lead, "M", "N"]:
        return f"y has dims {card.outputs[0].shape}: expects {[*lead, 'M', 'N']}"
    from_c = scaled_of(card, rest[0]) if rest and rest[0].name == "c" else None
    if isinstance(from_c, str):
        return from_c
    scaled = from_c
    if rest and scaled is None and rest[0].shape != ["N"]:
        return f"bias has dims {rest[0].shape}: expects ['N']"
    words = set(card.name.split("_"))
    activation = next((word for word in ("relu", "silu", "gelu") if word in words), "")
    activation += "_tanh" if activation == "gelu" and "tanh" in words else ""
    return GemmLayout(
        a_row_major=row_major["a"],
        b_row_major=row_major["b"],
        batched=batched,
        bias=bool(rest) and scaled is None,
        activation="" if scaled else activation,
        scaled=scaled,
    )


def alignment_problem(card: OperatorCard, layout: GemmLayout) -> str | None:
    """Why an operand's rows cannot be copied 16 bytes at a time (its contiguous dim is not a multiple of 8)."""
    sizes = card.sizes
    contiguous = {"a": "K" if layout.a_row_major else "M", "b": "N" if layout.b_row_major else "K"}
    for name, dim in contiguous.items():
        if sizes[dim] % ALIGNMENT:
            return f"{name}'s contiguous dim {dim} = {sizes[dim]} is not a multiple of {ALIGNMENT} (16-byte cp.async)"
    return None


def operand_maps(layout: GemmLayout, params: GemmParams) -> dict[str, TensorMapSpec]:
    """The TMA maps of a and b as CUTLASS's make_tma_copy_{A,B}_sm90 builds them for the collective's shared layout
    (sm90_mma_tma_gmma_ss_warpspecialized.hpp, copy_traits_sm90_tma.hpp): dims innermost first, with the batch
    (extent 1 on an unbatched card) outermost. The smem atom of an operand is as wide as its tile's contiguous dim
    allows, up to 128 bytes, and swizzles that span; one box is that row wide by the tile's other dim, and a
    multicast operand's box is split among the CTAs of the cluster that share it (each loads its slice for all)."""
    maps: dict[str, TensorMapSpec] = {}
    operands = (
        ("a", layout.a_row_major, params.tile_m, params.cluster_n),
        ("b", not layout.b_row_major, params.tile_n, params.cluster_m),
    )
    for name, k_major, tile_mn, sharing in operands:
        contiguous, other = (params.tile_k, tile_mn) if k_major else (tile_mn, params.tile_k)
        swizzle = next(span for span in SWIZZLES if contiguous * ELEMENT_BYTES % span == 0)
        maps[f"map_{name}"] = TensorMapSpec(
            tensor=name, box=[swizzle // ELEMENT_BYTES, other // sharing, 1], swizzle=swizzle, l2_promotion=L2_PROMOTION
        )
    return maps


def kernel_values(
    card: OperatorCard, layout: GemmLayout, params: GemmParams, entry: str, what: str
) -> dict[str, Value]:
    """What cuda/gemm_sm90.cu renders with, but for `conv` and its geometry (conv_sm90.py's)."""
    headers = find_cutlass()
    assert headers is not None, "unsupported() refuses cards without the CUTLASS headers"
    dtype = dtype_of(card)
    scaled = layout.scaled
    return {
        "what": what,
        "entry": entry,
        "dtype": dtype,
        "cutlass_version": headers.version,
        "schedule": params.schedule,
        "tile_m": params.tile_m,
        "tile_n": params.tile_n,
        "tile_k": params.tile_k,
        "swizzle": params.swizzle,
        "layout_a": "row-major [M, K]" if layout.a_row_major else "a transposed view, [K, M]",
        "layout_b": "row-major [K, N]" if layout.b_row_major else "a transposed view, [N, K]",
        "sm_count": SM_COUNT,
        "a_row_major": int(layout.a_row_major),
        "b_row_major": int(layout.b_row_major),
        "has_bias": int(layout.reads_source),
        "scaled": scaled is not None,
        "alpha": f"{scaled.alpha!r}f" if scaled else "",
        "beta": f"{scaled.beta!r}f" if scaled else "",
        "c_row_stride": scaled.row_stride if scaled else 0,
        "c_batch_stride": scaled.batch_stride if scaled else 0,
        "threads": THREADS,
        "shared_bytes": SHARED_BYTES,
        "element": ELEMENTS[dtype],
        "activation": ACTIVATIONS.get(layout.activation, "Identity"),
        "kernel_schedule": MAINLOOPS[params.mainloop] + SCHEDULES[params.schedule],
        "mainloop": params.mainloop,
        "tma": params.mainloop == "tma",
        "cluster_m": params.cluster_m,
        "cluster_n": params.cluster_n,
        "clustered": params.cluster_m * params.cluster_n > 1,
    }


def persistent_grid(params: GemmParams, m: str, n: str, batch: str) -> list[str | int]:
    """The persistent kernel's grid: a CTA per tile up to one per SM. A cluster's CTAs are neighbours in the grid,
    (CTAs along M, CLUSTER_N), the scheduler rasterising along M."""
    cm, cn = params.cluster_m, params.cluster_n
    clusters = f"cdiv({m}, {params.tile_m * cm}) * cdiv({n}, {params.tile_n * cn}) * {batch}"
    if cm * cn > 1:
        return [f"min({clusters}, {SM_COUNT // (cm * cn)}) * {cm}", cn]
    return [f"min({clusters}, {SM_COUNT})"]


class GemmSm90Template(Template[GemmParams]):
    name = "gemm_sm90"
    version = 2
    families = ("matmul",)
    entry = "kf_gemm"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("tile_m", "up", "bigger tiles: each element of b read fewer times"),
            Lever("tile_n", "up", "bigger tiles: each element of a read fewer times"),
            Lever("swizzle", "up", "neighbouring tiles share a and b in L2"),
            Lever("cluster_m", "up", "two CTAs along M load each tile of b once (TMA multicast)"),
            Lever("cluster_n", "up", "two CTAs along N load each tile of a once (TMA multicast)"),
        ),
        "memory_latency": (
            Lever("tile_k", "down", "more stages in flight"),
            Lever("schedule", "any", "one consumer's epilogue under the other's mainloop"),
            Lever("mainloop", "any", "TMA: one thread issues a whole tile's copy; cp.async: a warp group's loads"),
        ),
        "compute": (
            Lever("tile_n", "up", "wider wgmma per shared tile"),
            Lever("schedule", "any", "epilogue overlap against a shared tile"),
            Lever("tile_m", "any", "tiles against waves of SMs"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        layout = layout_of(card)
        if isinstance(layout, str):
            return layout
        dtype = dtypes_problem(card, ELEMENTS, "wgmma (fp32 is the matmul template's) takes")
        return dtype or cutlass_problem() or alignment_problem(card, layout)

    def space(self, card: OperatorCard) -> Space:
        return {
            "tile_m": (64, 128, 256),
            "tile_n": (64, 128, 256),
            "tile_k": (32, 64),
            "schedule": ("cooperative", "pingpong"),
            "swizzle": (1, 2, 4, 8),
            "mainloop": ("tma", "cp_async"),
            "cluster_m": (1, 2),
            "cluster_n": (1, 2),
        }

    def params_type(self, card: OperatorCard) -> type[GemmParams]:
        return GemmParams

    def problem(self, card: OperatorCard, params: GemmParams) -> str | None:
        cluster = params.cluster_m * params.cluster_n
        if cluster > 2:
            return f"a {params.cluster_m}x{params.cluster_n} cluster: 1x1, 2x1 or 1x2 here"
        if cluster > 1 and params.mainloop != "tma":
            return "a cluster shares tiles by TMA multicast: cp.async keeps the cluster 1x1"
        consumers = 256 if params.schedule == "cooperative" else 128
        if params.schedule == "cooperative" and params.tile_m < 128:
            return f"a cooperative tile splits its {params.tile_m} rows over two warp groups of 64: tile_m >= 128"
        accumulators = params.tile_m * params.tile_n // consumers
        if accumulators > MAX_ACCUMULATORS:
            return f"{accumulators} fp32 accumulators per consumer thread (at most {MAX_ACCUMULATORS})"
        stage = (params.tile_m + params.tile_n) * params.tile_k * 2
        if 2 * stage > SHARED_BYTES:
            return f"two stages of {stage} bytes exceed {SHARED_BYTES} bytes of shared memory"
        return None

    def render(self, card: OperatorCard, params: GemmParams) -> tuple[str, LaunchPlan]:
        layout = layout_of(card)
        assert not isinstance(layout, str), layout
        scaled = layout.scaled
        epilogue = " + bias" if layout.bias else ""
        if layout.activation:
            epilogue = f"{layout.activation}(a b{epilogue})"
        if scaled:
            epilogue = f"{scaled.beta!r} c + {scaled.alpha!r} a b"
        what = f"y = {epilogue or 'a b'}" + (", batched" if layout.batched else "")
        source = render("gemm_sm90.cu", **kernel_values(card, layout, params, self.entry, what), conv=False)
        batch = "batch" if layout.batched else "1"
        maps = operand_maps(layout, params) if params.mainloop == "tma" else {}
        source_tensor = [card.inputs[2].name] if layout.reads_source else []
        plan = LaunchPlan(
            entry=self.entry,
            grid=persistent_grid(params, "M", "N", batch),
            block=[THREADS],
            shared_bytes=SHARED_BYTES,
            args=[*(maps or ["a", "b"]), *source_tensor, "y", "M", "N", "K", batch],
            tensor_maps=maps,
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """CUTLASS's usual Hopper bf16 picks first, with TMA: 128x256x64 cooperative alone and in clusters of two
        along M and along N, 128x128x64 pingpong and cooperative in a 2x1 cluster (more tiles than SMs, for small or
        skinny products); then the cp.async mainloop's best (the same 128x256x64), to compare."""
        base: Params = {
            "tile_m": 128,
            "tile_n": 256,
            "tile_k": 64,
            "schedule": "cooperative",
            "swizzle": 1,
            "mainloop": "tma",
            "cluster_m": 1,
            "cluster_n": 1,
        }
        return [
            base,
            {**base, "cluster_m": 2},
            {**base, "cluster_n": 2},
            {**base, "tile_n": 128, "schedule": "pingpong"},
            {**base, "tile_n": 128, "cluster_m": 2},
            {**base, "mainloop": "cp_async"},
        ]
