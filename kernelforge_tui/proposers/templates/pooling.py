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
"""

from __future__ import annotations

import math
from typing import ClassVar

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
    dtype_of,
    launch_bounds,
    naming_problem,
    prelude,
    reduce_helpers,
    vec_widths,
)
from kernelforge_tui.proposers.templates.elementwise import operation_in

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

# The stream kernel's work split, written once: render() pastes these C expressions into the kernel and the tests
# evaluate them (integer division) to check that every element is loaded once and every plane summed whole.
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


def stream_counts(card: OperatorCard, params: Params) -> dict[str, int]:
    """The stream kernel's compile-time counts: chunks of a run, loads a thread, tail steps, summing steps."""
    hw, run, block, vec = _plane_size(card), int(params["planes"]), int(params["block"]), int(params["vec"])
    chunks = run * hw // vec
    return {
        "CHUNKS": chunks,
        "LOADS": math.ceil(chunks / block),
        "TAIL_STEPS": math.ceil(run * hw / block),
        "SUMS": math.ceil(run * int(params["tpr"]) / block),
        "STEPS": math.ceil(hw / int(params["tpr"])),
    }


class PoolingTemplate(Template):
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

    def canonical(self, card: OperatorCard, params: Params) -> Params:
        """The direct strategy has no runs and bounds one block an SM: those parameters are fixed."""
        if _max_2x2(card) or params["strategy"] == "stream":
            return dict(params)
        return {**params, **UNUSED_BY_DIRECT}

    def problem(self, card: OperatorCard, params: Params) -> str | None:
        if _max_2x2(card):
            wo = card.sizes["w"] // 2
            return f"ow {params['ow']} does not divide w/2 = {wo}" if wo % int(params["ow"]) else None
        hw, tpr, vec = _plane_size(card), int(params["tpr"]), int(params["vec"])
        if params["strategy"] == "direct":
            if hw % vec:
                return f"vec {vec} does not divide h*w = {hw}"
            return "more threads per row than chunks" if tpr > max(1, hw // vec) else None
        run, block, minb = int(params["planes"]), int(params["block"]), int(params["minb"])
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

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        if _max_2x2(card):
            return self._render_max(card, params)
        if params["strategy"] == "stream":
            return self._render_stream(card, params)
        dtype = dtype_of(card)
        tpr, block, vec = int(params["tpr"]), int(params["block"]), int(params["vec"])
        source = f"""// adaptive_avg_pool 1x1 ({dtype}, fp32 sums): {tpr} threads per plane, {vec}-element vectors.
// Generated by the template proposer.
{prelude(dtype, vec)}#define TPR {tpr}
#define RPB {block // tpr}
{reduce_helpers(True)}
extern "C" __global__ void {launch_bounds(block, 1)} {self.entry}(const T* __restrict__ x, T* __restrict__ y,
                                                           int planes, int hw) {{
const long long row = (long long)blockIdx.x * RPB + threadIdx.x / TPR;
const int t = threadIdx.x % TPR;
const bool valid = row < planes;  // spare threads still shuffle
const int nv = valid ? hw / VEC : 0;
const T* __restrict__ xr = x + (valid ? row : 0) * (long long)hw;
float s = 0.0f;
for (int i = t; i < nv; i += TPR) {{
 float f[VEC];
 load_chunk(xr, i, f);
#pragma unroll
 for (int j = 0; j < VEC; ++j) {{ s += f[j]; }}
}}
s = group_reduce<TPR>(Sum{{s}}, static_cast<Sum*>(nullptr)).s;  // TPR <= 32: shuffles only
if (valid && t == 0) {{
 y[row] = from_f(s / (float)hw);
}}
}}
"""
        plan = LaunchPlan(
            entry=self.entry, grid=[f"cdiv(n * c, {block // tpr})"], block=[block], args=["x", "y", "n * c", "h * w"]
        )
        return source, plan

    def _render_stream(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        hw, run, block, vec, tpr = (
            int(v) for v in (_plane_size(card), *(params[k] for k in ("planes", "block", "vec", "tpr")))
        )
        counts = stream_counts(card, params)
        defines = "".join(f"#define {name} {value}\n" for name, value in counts.items())
        source = f"""// adaptive_avg_pool 1x1 ({dtype}, fp32 sums), stream: runs of {run} planes of {hw} elements a
// block, {vec}-element evict-first loads into shared memory, {tpr} lanes a plane sum, minb {params["minb"]}.
// Generated by the template proposer.
{prelude(dtype, vec)}#define HW {hw}
#define PLANES {run}
#define BLOCK {block}
#define TPR {tpr}
{defines}typedef {RAW_LOAD[vec * ELEMENT_BYTES[dtype]]} Raw;  // VEC elements, one load
{reduce_helpers(False)}
// The run of PLANES planes from plane `first` is PLANES * HW elements from element first * HW, a multiple of VEC:
// chunk c of it is VEC elements from element c * VEC, aligned for one load.
extern "C" __global__ void {launch_bounds(block, int(params["minb"]))} {self.entry}(const T* __restrict__ x,
                                                                 T* __restrict__ y, long long planes) {{
__shared__ Raw run[CHUNKS];
const long long first = (long long)blockIdx.x * PLANES;
if (first + PLANES <= planes) {{
 const Raw* __restrict__ src = reinterpret_cast<const Raw*>(x + first * HW);
 Raw r[LOADS];
#pragma unroll
 for (int u = 0; u < LOADS; ++u) {{  // every load issued before any is stored
  const int c = {LOAD_CHUNK};
  if (c < CHUNKS) {{ r[u] = __ldcs(src + c); }}
 }}
#pragma unroll
 for (int u = 0; u < LOADS; ++u) {{
  const int c = {LOAD_CHUNK};
  if (c < CHUNKS) {{ run[c] = r[u]; }}
 }}
}} else {{  // the card's last run, short of PLANES planes: element by element
 const int count = (int)(planes - first) * HW;
 for (int k = 0; k < TAIL_STEPS; ++k) {{
  const int e = {TAIL_ELEMENT};
  if (e < count) {{ reinterpret_cast<T*>(run)[e] = x[first * HW + e]; }}
 }}
}}
__syncthreads();
const T* plane_elements = reinterpret_cast<const T*>(run);
#pragma unroll
for (int it = 0; it < SUMS; ++it) {{
 const int slot = {SUM_SLOT};
 const int p = {SLOT_PLANE};
 const int lane = {SLOT_LANE};
 const bool valid = p < PLANES && first + p < planes;  // spare lanes still shuffle
 float s = 0.0f;
#pragma unroll
 for (int j = 0; j < STEPS; ++j) {{
  const int k = {PLANE_ELEMENT};
  if (valid && k < HW) {{ s += to_f(plane_elements[p * HW + k]); }}
 }}
 s = group_reduce<TPR>(Sum{{s}}, static_cast<Sum*>(nullptr)).s;  // TPR <= 32: shuffles only
 if (valid && lane == 0) {{
  y[first + p] = from_f(s / (float)HW);
 }}
}}
}}
"""
        plan = LaunchPlan(entry=self.entry, grid=[f"cdiv(n * c, {run})"], block=[block], args=["x", "y", "n * c:i64"])
        return source, plan

    def _render_max(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        ow, block, unroll = int(params["ow"]), int(params["block"]), int(params["unroll"])
        source = f"""// max_pool2d 2x2, stride 2 ({dtype}, NaN kept): {ow} outputs a chunk, {unroll} chunks a thread.
// Generated by the template proposer.
{prelude(dtype, 2 * ow)}#define OW {ow}
#define BLOCK {block}
#define UNROLL {unroll}

struct __align__({ow * ELEMENT_BYTES[dtype]}) OutT {{
    T v[OW];
}};

// torch's max: a NaN value replaces the running max, and nothing replaces a NaN max (v > NaN is false).
__device__ __forceinline__ float nan_max(float m, float v) {{ return (v > m || v != v) ? v : m; }}

// Chunk c holds OW outputs of output row r = c / row_chunks (over all planes: plane * h/2 + row in the plane), from
// input rows 2r and 2r + 1 (h = 2 * h/2), whose VEC = 2 * OW elements are chunk 2r * row_chunks + c % row_chunks
// of x and the chunk a row further (w / VEC = row_chunks chunks a row). OW divides w/2: nothing crosses a row.
extern "C" __global__ void {launch_bounds(block, 1)} {MAX_ENTRY}(const T* __restrict__ x, T* __restrict__ y,
                                                          long long chunks, int row_chunks) {{
float top[UNROLL][VEC];
float bottom[UNROLL][VEC];
#pragma unroll
for (int u = 0; u < UNROLL; ++u) {{
 const long long c = (long long)blockIdx.x * (BLOCK * UNROLL) + u * BLOCK + threadIdx.x;
 if (c < chunks) {{
  const long long first = c / row_chunks * 2 * row_chunks + c % row_chunks;
  load_chunk(x, first, top[u]);
  load_chunk(x, first + row_chunks, bottom[u]);
 }}
}}
#pragma unroll
for (int u = 0; u < UNROLL; ++u) {{
 const long long c = (long long)blockIdx.x * (BLOCK * UNROLL) + u * BLOCK + threadIdx.x;
 if (c < chunks) {{
  OutT o;
#pragma unroll
  for (int j = 0; j < OW; ++j) {{
   float m = top[u][2 * j];
   m = nan_max(m, top[u][2 * j + 1]);
   m = nan_max(m, bottom[u][2 * j]);
   m = nan_max(m, bottom[u][2 * j + 1]);
   o.v[j] = from_f(m);
  }}
  reinterpret_cast<OutT*>(y)[c] = o;
 }}
}}
}}
"""
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
