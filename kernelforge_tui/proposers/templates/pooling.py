"""Pooling over NCHW: adaptive average pooling to 1x1, and max pooling over 2x2 windows with stride 2.

Convention: x [n, c, h, w], sizes n, c, h, w, one dtype.

Average to 1x1: y with n*c elements ([n, c] or [n, c, 1, 1]), y[n, c] = mean of x[n, c, :, :], fp32 sums. Each
(n, c) plane is a row of h*w contiguous elements, usually short (7x7 = 49 bf16 = 98 bytes: planes are not 16-byte
aligned, and a thread or a warp a plane waits on its few loads). Two strategies:
- `stream`: a block owns a run of `planes` consecutive planes (their planes * h*w elements start on a vector when
  `vec` divides that count), loads the whole run with coalesced, evict-first loads of `vec` elements (all issued
  before any is stored) into shared memory, then `tpr` lanes a plane sum it in fp32 (lane j takes elements j,
  j + tpr, ...; shuffles combine them) and write the mean: consecutive planes, coalesced stores. The last run of a
  card whose plane count `planes` does not divide is loaded element by element. `minb` bounds the registers
  (__launch_bounds__) so that many blocks are resident: their loads overlap the others' sums.
- `direct`: `tpr` threads a plane (1..32, reduced by warp shuffles) read it in place with `vec`-element loads
  (`vec` must divide h*w).

Max over 2x2 windows, stride 2 (a card whose reference or name says max_pool): y [n, c, h/2, w/2]. NaN
propagates as torch.max_pool2d does: a NaN value replaces the running max and nothing replaces a NaN max, in the
window order top-left, top-right, bottom-left, bottom-right; the max is one of the inputs, so it is written
exactly. A thread makes `ow` adjacent outputs of a row from two vector loads (2 * ow elements of each input row of
the window) and one store. Parameters: `ow` (must divide w/2, so loads are aligned and never cross a row), `block`,
`unroll` (chunks per thread, all loads issued before the math).

The kernels are cuda/avg_pool_stream.cu, cuda/avg_pool_direct.cu and cuda/max_pool.cu.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    ELEMENT_BYTES,
    STATIC_SHARED,
    THREADS_PER_SM,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    naming_problem,
    prelude_values,
    reduce_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.elementwise import operation_in
from kernelforge_tui.proposers.templates.source import render

MAX_POOL = ("max_pool", "max_pooling")
"""Words in a card's reference function or name that make it a max pooling."""
MAX_ENTRY = "kf_max_pool"

STRATEGIES = ("stream", "direct")
RUN_PLANES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_BLOCKS = (1, 2, 4, 8, 16)
MAX_LOADS = 32
"""Vector loads a thread holds in registers at once in the stream strategy (16 bytes each: 128 registers)."""
SEED_RUN_BYTES = 8192
"""The first seed's run: about 8 KB a block, 8 blocks of 256 threads an SM keep ~64 KB of loads in flight."""
UNUSED_BY_DIRECT: Params = {"planes": RUN_PLANES[0], "minb": MIN_BLOCKS[0]}
RAW_LOAD = {2: "unsigned short", 4: "unsigned int", 8: "int2", 16: "int4"}
"""The type one load of VEC elements reads, by bytes: __ldcs takes built-in and CUDA vector types only."""

# The stream kernel's work split, written once: render() fills these C expressions into cuda/avg_pool_stream.cu and
# the tests evaluate them (integer division) to check that every element is loaded once and every plane summed whole.
LOAD_CHUNK = "u * BLOCK + threadIdx.x"
"""The chunk of the run (VEC elements from element chunk * VEC) that load u of a thread reads, if < CHUNKS."""
TAIL_ELEMENT = "k * BLOCK + threadIdx.x"
"""The element of a partial last run that step k of a thread loads, if inside the run's planes."""
SUM_SLOT = "it * BLOCK + threadIdx.x"
"""Summing slot of a thread in step it: plane SLOT_PLANE of the run, lane SLOT_LANE of its TPR."""
SLOT_PLANE = "slot / TPR"
SLOT_LANE = "slot % TPR"
PLANE_ELEMENT = "lane + j * TPR"
"""The element of its plane that a lane adds in step j, if < HW."""


def _max_2x2(card: OperatorCard) -> bool:
    """Whether the card is the max pooling mode (else average to 1x1)."""
    return operation_in((card.reference.function or "", card.name), MAX_POOL) is not None


def _plane_size(card: OperatorCard) -> int:
    return card.sizes["h"] * card.sizes["w"]


class AvgPoolParams(TemplateParams):
    strategy: Literal["stream", "direct"]
    tpr: int
    block: int
    vec: int
    planes: int
    minb: int


class MaxPoolParams(TemplateParams):
    ow: int
    block: int
    unroll: int


def stream_counts(card: OperatorCard, params: AvgPoolParams) -> dict[str, int]:
    """The stream kernel's compile-time counts: chunks of a run, loads a thread, tail steps, summing steps."""
    hw, run, block, vec = _plane_size(card), params.planes, params.block, params.vec
    chunks = run * hw // vec
    return {
        "CHUNKS": chunks,
        "LOADS": math.ceil(chunks / block),
        "TAIL_STEPS": math.ceil(run * hw / block),
        "SUMS": math.ceil(run * params.tpr / block),
        "STEPS": math.ceil(hw / params.tpr),
    }


class PoolingTemplate(Template[AvgPoolParams | MaxPoolParams]):
    name = "pooling"
    families = ("pooling",)
    entry = "kf_avg_pool"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("vec", "up", "wider accesses"),
            Lever("planes", "up", "longer runs of planes a block"),
            Lever("ow", "up", "wider loads and stores"),
        ),
        "memory_latency": (
            Lever("strategy", "down", "runs streamed into shared memory, not planes read in place"),
            Lever("block", "any", "block size"),
            Lever("planes", "any", "planes a block"),
            Lever("minb", "up", "more resident blocks"),
            Lever("tpr", "any", "threads per plane"),
            Lever("unroll", "up", "more loads in flight"),
        ),
        "compute": (
            Lever("vec", "up", "fewer instructions per element"),
            Lever("ow", "up", "fewer instructions per output"),
        ),
    }
    """The average's (strategy, planes, minb, tpr, vec) and the max's (ow, unroll): each space has only its own."""

    def unsupported(self, card: OperatorCard) -> str | None:
        problem = naming_problem(card, ["x"], ["y"], ["n", "c", "h", "w"])
        if problem is not None:
            return problem
        n, c, h, w = (card.sizes[k] for k in ("n", "c", "h", "w"))
        if not _max_2x2(card):
            return None if card.outputs[0].numel(card.sizes) == n * c else "y must have n*c elements (pooling to 1x1)"
        if h % 2 or w % 2 or card.outputs[0].dims(card.sizes) != (n, c, h // 2, w // 2):
            return "max pooling takes 2x2 windows with stride 2: y [n, c, h/2, w/2], h and w even"
        return None

    def space(self, card: OperatorCard) -> Space:
        if _max_2x2(card):
            outputs = tuple(ow for ow in (1, 2, 4) if 2 * ow * ELEMENT_BYTES[dtype_of(card)] <= 16)
            return {"ow": outputs, "block": (64, 128, 256, 512, 1024), "unroll": (1, 2, 4)}
        return {
            "strategy": STRATEGIES,
            "tpr": (1, 2, 4, 8, 16, 32),
            "block": (64, 128, 256, 512),
            "vec": vec_widths(dtype_of(card)),
            "planes": RUN_PLANES,
            "minb": MIN_BLOCKS,
        }

    def params_type(self, card: OperatorCard) -> type[AvgPoolParams | MaxPoolParams]:
        return MaxPoolParams if _max_2x2(card) else AvgPoolParams

    def canonical(self, card: OperatorCard, params: AvgPoolParams | MaxPoolParams) -> AvgPoolParams | MaxPoolParams:
        """The direct strategy has no runs and bounds one block an SM: those parameters are fixed."""
        if isinstance(params, MaxPoolParams) or params.strategy == "stream":
            return params
        return params.but(**UNUSED_BY_DIRECT)

    def problem(self, card: OperatorCard, params: AvgPoolParams | MaxPoolParams) -> str | None:
        if isinstance(params, MaxPoolParams):
            wo = card.sizes["w"] // 2
            return f"ow {params.ow} does not divide w/2 = {wo}" if wo % params.ow else None
        hw, tpr, vec = _plane_size(card), params.tpr, params.vec
        if params.strategy == "direct":
            if hw % vec:
                return f"vec {vec} does not divide h*w = {hw}"
            return "more threads per row than chunks" if tpr > max(1, hw // vec) else None
        run, block, minb = params.planes, params.block, params.minb
        if run * hw % vec:
            return f"vec {vec} does not divide planes * h*w = {run * hw}: runs would not start on a vector"
        if run > 1 and run // 2 >= card.sizes["n"] * card.sizes["c"]:
            return f"a run of {run // 2} planes already holds the card's {card.sizes['n'] * card.sizes['c']}"
        if (shared := run * hw * ELEMENT_BYTES[dtype_of(card)]) > STATIC_SHARED:
            return f"a run of {shared} bytes: over the {STATIC_SHARED} of shared memory a block may declare"
        if (loads := stream_counts(card, params)["LOADS"]) > MAX_LOADS:
            return f"{loads} loads a thread: over {MAX_LOADS} held in registers"
        if tpr > hw:
            return f"tpr {tpr} > h*w = {hw}: lanes with no element"
        if minb * block > THREADS_PER_SM:
            return f"minb {minb} x block {block} exceeds {THREADS_PER_SM} threads an SM"
        return None

    def render(self, card: OperatorCard, params: AvgPoolParams | MaxPoolParams) -> tuple[str, LaunchPlan]:
        if isinstance(params, MaxPoolParams):
            return self._render_max(card, params)
        if params.strategy == "stream":
            return self._render_stream(card, params)
        dtype = dtype_of(card)
        tpr, block, vec = params.tpr, params.block, params.vec
        source = render(
            "avg_pool_direct.cu",
            **prelude_values(dtype, vec),
            **reduce_values(True),
            dtype=dtype,
            tpr=tpr,
            rpb=block // tpr,
            block=block,
        )
        plan = LaunchPlan(
            entry=self.entry, grid=[f"cdiv(n * c, {block // tpr})"], block=[block], args=["x", "y", "n * c", "h * w"]
        )
        return source, plan

    def _render_stream(self, card: OperatorCard, params: AvgPoolParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        hw, run, block, vec, tpr = _plane_size(card), params.planes, params.block, params.vec, params.tpr
        counts = stream_counts(card, params)
        source = render(
            "avg_pool_stream.cu",
            **prelude_values(dtype, vec),
            **reduce_values(False),
            **{name.lower(): value for name, value in counts.items()},
            dtype=dtype,
            run=run,
            hw=hw,
            tpr=tpr,
            minb=params.minb,
            block=block,
            raw=RAW_LOAD[vec * ELEMENT_BYTES[dtype]],
            load_chunk=LOAD_CHUNK,
            tail_element=TAIL_ELEMENT,
            sum_slot=SUM_SLOT,
            slot_plane=SLOT_PLANE,
            slot_lane=SLOT_LANE,
            plane_element=PLANE_ELEMENT,
        )
        plan = LaunchPlan(entry=self.entry, grid=[f"cdiv(n * c, {run})"], block=[block], args=["x", "y", "n * c:i64"])
        return source, plan

    def _render_max(self, card: OperatorCard, params: MaxPoolParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        ow, block, unroll = params.ow, params.block, params.unroll
        source = render(
            "max_pool.cu",
            **prelude_values(dtype, 2 * ow),
            dtype=dtype,
            ow=ow,
            unroll=unroll,
            block=block,
            out_bytes=ow * ELEMENT_BYTES[dtype],
        )
        chunks = f"n * c * (h / 2) * (w / 2) / {ow}"
        plan = LaunchPlan(
            entry=MAX_ENTRY,
            grid=[f"cdiv({chunks}, {block * unroll})"],
            block=[block],
            args=["x", "y", f"{chunks}:i64", f"w / 2 / {ow}"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """Average: runs of about SEED_RUN_BYTES streamed with the widest load they allow first, then other runs
        and blocks, then the direct strategy's lane groups."""
        if _max_2x2(card):
            ow = max(self.space(card)["ow"])
            return [
                {"ow": ow, "block": 256, "unroll": 1},
                {"ow": ow, "block": 128, "unroll": 4},
                {"ow": 1, "block": 256, "unroll": 2},
                {"ow": 1, "block": 512, "unroll": 1},
            ]
        widths = vec_widths(dtype_of(card))
        direct = [
            {"tpr": 1, "block": 256, "vec": 1},
            {"tpr": 8, "block": 256, "vec": 1},
            {"tpr": 32, "block": 128, "vec": widths[-1]},
            {"tpr": 4, "block": 128, "vec": widths[-1]},
        ]
        return [
            *(
                self._stream_seed(card, bytes_, block)
                for bytes_, block in ((SEED_RUN_BYTES, 256), (4096, 128), (2 * SEED_RUN_BYTES, 512))
            ),
            *({"strategy": "direct", **p, **UNUSED_BY_DIRECT} for p in direct),
        ]

    def _stream_seed(self, card: OperatorCard, run_bytes: int, block: int) -> Params:
        """The longest run of a power of two planes within run_bytes (one plane at least, no longer than the card),
        its widest aligned load, as many lanes a plane as fill the block, and the block's full occupancy."""
        hw, planes = _plane_size(card), card.sizes["n"] * card.sizes["c"]
        plane_bytes = hw * ELEMENT_BYTES[dtype_of(card)]
        run = max([r for r in RUN_PLANES if r * plane_bytes <= run_bytes and (r == 1 or r // 2 < planes)], default=1)
        vec = max(v for v in vec_widths(dtype_of(card)) if run * hw % v == 0)
        tpr = max(t for t in (1, 2, 4, 8, 16, 32) if (t <= hw and run * t <= block) or t == 1)
        return {
            "strategy": "stream",
            "tpr": tpr,
            "block": block,
            "vec": vec,
            "planes": run,
            "minb": THREADS_PER_SM // block,
        }
