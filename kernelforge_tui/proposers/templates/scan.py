"""Inclusive scans (prefix sums) in one launch: y[i] = x[0] + ... + x[i], fp32 sums.

Convention: x [n] -> y [n], size n, one dtype (fp32/bf16/fp16).

Why every block re-sums what comes before it: the fast single-pass scans (CUB's decoupled look-back, a chained
scan) hand each block's total to the next through flags in memory that must be zeroed (or stamped with an epoch)
before the launch, and a card gives its kernel one launch and its tensors only: outputs are poisoned, not zeroed,
there is no scratch buffer and no grid-wide barrier, so no block may wait for another. What a block can do alone
is read: block b sums x[0, b * CHUNK) itself (its carry), then scans its own chunk. That is correct for every n and
launch order, and costs n^2 / (2 * CHUNK) reads in all: at n = 2^22 and CHUNK = 8192, 1.1e9 (4 GB in fp32, mostly
from L2), against 2n for a look-back scan. So the parameters trade the carry's cost (a bigger chunk: fewer
re-reads, and vector loads for them) against parallelism (fewer, busier blocks; the last block's carry is read by
one SM). This is as far as an honest single-launch scan goes; beating CUB at large n needs scratch memory or a
second launch, which cards do not offer.

Parameters: `block` (threads), `ipt` (consecutive items per thread: CHUNK = block * ipt), `vec` (elements per
vector load of the carry; chunks start at multiples of CHUNK, so every load is aligned and there is no tail), and
`stage` (1: the chunk goes through shared memory, loaded and stored coalesced; 0: each thread reads and writes its
ipt consecutive elements straight from global memory).
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    STATIC_SHARED,
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

SMALLEST_CHUNK = 128
MOST_REREADS = 4096
"""A chunk must be at least n / 4096: smaller ones re-read x more than n / 2 / CHUNK = 2048 times over (the suite's
naive baseline, CHUNK 2048, re-reads it 1024 times at 2^22), slower than the baseline before they start."""


def _staged_bytes(chunk: int) -> int:
    """The staged chunk as fp32, one padding slot per 32 (so a thread's consecutive items fall in different banks),
    plus the warp totals and the reduction's scratch."""
    return 4 * (chunk + chunk // 32) + 2 * 4 * 32


class ScanTemplate(Template):
    families = ("scan",)
    entry = "kf_scan"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("ipt", "up", "bigger chunks: fewer re-reads for the carries"),
            Lever("vec", "up", "wider carry loads"),
            Lever("stage", "up", "coalesced chunk loads and stores"),
        ),
        "memory_latency": (
            Lever("block", "up", "more threads sum each carry"),
            Lever("vec", "up", "more bytes per carry load"),
        ),
        "compute": (
            Lever("vec", "up", "fewer instructions per carry element"),
            Lever("ipt", "up", "fewer carry re-reads"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        problem = naming_problem(card, ["x"], ["y"], ["n"])
        if problem is None and any(t.numel(card.sizes) != card.sizes["n"] for t in [*card.inputs, *card.outputs]):
            return "x and y must have n elements (a scan over one axis)"
        return problem

    def space(self, card: OperatorCard) -> Space:
        return {
            "block": (128, 256, 512, 1024),
            "ipt": (1, 2, 4, 8, 16),
            "vec": vec_widths(dtype_of(card)),
            "stage": (0, 1),
        }

    def canonical(self, card: OperatorCard, params: Params) -> Params:
        # One item per thread is coalesced either way: staging changes nothing.
        return {**params, "stage": 0} if params["ipt"] == 1 else dict(params)

    def problem(self, card: OperatorCard, params: Params) -> str | None:
        chunk = int(params["block"]) * int(params["ipt"])
        n = card.sizes["n"]
        if chunk > max(n, SMALLEST_CHUNK):
            return f"a chunk of {chunk} exceeds n = {n}: most threads would idle"
        if n > MOST_REREADS * chunk:
            return f"a chunk of {chunk} re-reads x {n // (2 * chunk)} times over (n / {MOST_REREADS} at least)"
        if params["stage"] and _staged_bytes(chunk) > STATIC_SHARED:
            return f"staging a chunk of {chunk} needs {_staged_bytes(chunk)} bytes of shared memory (48 KiB at most)"
        return None

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        block, ipt, vec, stage = (int(params[k]) for k in ("block", "ipt", "vec", "stage"))
        if stage:
            load = """#pragma unroll
for (int k = 0; k < IPT; ++k) {
 const int s = k * BLOCK + t;
 tile[PAD(s)] = start + s < n ? to_f(x[start + s]) : 0.0f;
}
__syncthreads();
#pragma unroll
for (int k = 0; k < IPT; ++k) {
 v[k] = tile[PAD(t * IPT + k)];
}
"""
            store = """#pragma unroll
for (int k = 0; k < IPT; ++k) {
 tile[PAD(t * IPT + k)] = v[k];  // the slots this thread read: no other thread touches them in between
}
__syncthreads();
#pragma unroll
for (int k = 0; k < IPT; ++k) {
 const int s = k * BLOCK + t;
 if (start + s < n) {
  y[start + s] = from_f(tile[PAD(s)]);
 }
}
"""
            tile = "__shared__ float tile[CHUNK + CHUNK / 32];\n"
        else:
            load = """#pragma unroll
for (int k = 0; k < IPT; ++k) {
 const long long g = start + (long long)t * IPT + k;
 v[k] = g < n ? to_f(x[g]) : 0.0f;
}
"""
            store = """#pragma unroll
for (int k = 0; k < IPT; ++k) {
 const long long g = start + (long long)t * IPT + k;
 if (g < n) {
  y[g] = from_f(v[k]);
 }
}
"""
            tile = ""
        source = f"""// Inclusive scan ({dtype}, fp32 sums) in one launch: {block} threads x {ipt} items per chunk,
// the carry re-summed from x with {vec}-element loads, chunk staged in shared memory {stage}.
// Generated by the template proposer.
{prelude(dtype, vec)}{reduce_helpers(False)}
#define BLOCK {block}
#define IPT {ipt}
#define CHUNK (BLOCK * IPT)
#define PAD(i) ((i) + (i) / 32)

extern "C" __global__ void {launch_bounds(block, 1)} {self.entry}(const T* __restrict__ x, T* __restrict__ y,
                                                           long long n) {{
__shared__ Sum red[32];
__shared__ float warp_total[32];
{tile}const int t = threadIdx.x;
const int lane = t & 31;
const int warp = t >> 5;
const long long start = (long long)blockIdx.x * CHUNK;

// 1. The carry: every element before this chunk, read again (start is a multiple of VEC: aligned, no tail).
float part = 0.0f;
#pragma unroll 4
for (long long i = t; i < start / VEC; i += BLOCK) {{
 float f[VEC];
 load_chunk(x, i, f);
#pragma unroll
 for (int j = 0; j < VEC; ++j) {{ part += f[j]; }}
}}
const float carry = group_reduce<BLOCK>(Sum{{part}}, red).s;

// 2. Each thread's IPT consecutive items, scanned serially.
float v[IPT];
{load}#pragma unroll
for (int k = 1; k < IPT; ++k) {{
 v[k] += v[k - 1];
}}

// 3. The threads' totals: scanned within each warp by shuffles, then across the warps' totals.
float inclusive = v[IPT - 1];
#pragma unroll
for (int o = 1; o < 32; o <<= 1) {{
 const float up = __shfl_up_sync(FULL_MASK, inclusive, o);
 if (lane >= o) {{ inclusive += up; }}
}}
float exclusive = __shfl_up_sync(FULL_MASK, inclusive, 1);
if (lane == 0) {{ exclusive = 0.0f; }}
if (lane == 31) {{ warp_total[warp] = inclusive; }}
__syncthreads();
float base = carry;
for (int w = 0; w < warp; ++w) {{
 base += warp_total[w];
}}
base += exclusive;

// 4. Every item plus what precedes this thread, written back.
#pragma unroll
for (int k = 0; k < IPT; ++k) {{
 v[k] += base;
}}
{store}}}
"""
        plan = LaunchPlan(entry=self.entry, grid=[f"cdiv(n, {block * ipt})"], block=[block], args=["x", "y", "n:i64"])
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        widest = max(vec_widths(dtype_of(card)))
        return [
            {"block": 256, "ipt": 8, "vec": widest, "stage": 1},
            {"block": 1024, "ipt": 8, "vec": widest, "stage": 1},
            {"block": 512, "ipt": 16, "vec": widest, "stage": 0},
            {"block": 128, "ipt": 4, "vec": 1, "stage": 0},
        ]
