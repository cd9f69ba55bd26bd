"""Group norm over NCHW: y = (x - mean) * rstd * gamma[c] + beta[c], statistics per (sample, group), eps 1e-5.

Convention: inputs x [n, c, h, w], then per-channel scale and shift [c] (taken by position, any
names, e.g. x, gamma, beta); output y like x, optionally followed by the group statistics mean and rstd [n, groups]
(what aten.native_group_norm returns beside y: a captured call must return them); sizes n, c, h, w, groups (c
divisible by groups); one dtype, math in fp32. A (sample, group) is one contiguous span of c/groups * h * w elements.

Parameters: `block`, `vec` (must divide h*w so a chunk never straddles two channels), `split` (blocks
per group: a thread block cluster whose blocks merge their partial statistics through distributed
shared memory, so a few large groups still fill 132 SMs), `welford` (one (count, mean, M2)
reduction, or mean then centred sum of squares with one more read).

Normalising is (x - mean) * (gamma * rstd) + beta, not torch's x * a + (beta - mean * a): on a constant group
rstd = 1/sqrt(eps) = 316, and x * a cancels against mean * a in fp32's last bits, which beyond |x| ~ 100 is more
than a bf16 card's tolerance (the stress set equal-rows failed every seed on the H200's diffusion block that way).
x - mean is exact there, and one subtraction more per element costs nothing in a kernel bound by memory.
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    dtype_of,
    launch_bounds,
    prelude,
    reduce_helpers,
    vec_widths,
)

SIZES = ("n", "c", "h", "w", "groups")


class GroupNormTemplate(Template):
    families = ("group_norm",)
    entry = "kf_group_norm"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("welford", "up", "statistics in one pass: x read twice, not three times"),
            Lever("vec", "up", "wider accesses"),
        ),
        "memory_latency": (
            Lever("split", "up", "more blocks per group fill the SMs"),
            Lever("block", "any", "threads per group"),
        ),
        "compute": (Lever("vec", "up", "fewer instructions per element"),),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        if len(card.inputs) != 3 or len(card.outputs) not in (1, 3):
            return "expects inputs x, gamma, beta and the output y, or y, mean and rstd"
        groups = (card.sizes.get("n"), card.sizes.get("groups"))
        if len(card.outputs) == 3 and any(tuple(o.dims(card.sizes)) != groups for o in card.outputs[1:]):
            return "mean and rstd outputs must have shape [n, groups]"
        if any(s not in card.sizes for s in SIZES):
            return f"card lacks sizes among {SIZES}"
        dtypes = {t.dtype for t in [*card.inputs, *card.outputs]}
        if len(dtypes) != 1 or not dtypes <= set(C_TYPE):
            return f"expects one dtype among {sorted(C_TYPE)}"
        if card.sizes["c"] % card.sizes["groups"]:
            return "c must be divisible by groups"
        return None

    def space(self, card: OperatorCard) -> Space:
        return {
            "block": (128, 256, 512, 1024),
            "vec": vec_widths(dtype_of(card)),
            "split": (1, 2, 4, 8),
            "welford": (0, 1),
        }

    def problem(self, card: OperatorCard, params: Params) -> str | None:
        if (card.sizes["h"] * card.sizes["w"]) % int(params["vec"]):
            return f"vec {params['vec']} does not divide h*w"
        return None

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        block, vec, split = int(params["block"]), int(params["vec"]), int(params["split"])
        state = "Welford" if params["welford"] else "Sum"
        if params["welford"]:
            stats = """Welford acc = {0.0f, 0.0f, 0.0f};
for (long long i = lo + threadIdx.x; i < hi; i += BLOCK) {
 float f[VEC];
 load_chunk(xg, i, f);
 float cm = 0.0f, c2 = 0.0f;
#pragma unroll
 for (int j = 0; j < VEC; ++j) { cm += f[j]; }
 cm *= 1.0f / VEC;
#pragma unroll
 for (int j = 0; j < VEC; ++j) { const float d = f[j] - cm; c2 += d * d; }
 acc = Welford::combine(acc, Welford{(float)VEC, cm, c2});
}
acc = reduce_all(acc, red, &part);
const float mean = acc.mean;
const float rstd = rsqrtf(acc.m2 / (float)len + 1e-5f);
"""
        else:
            stats = """float sum = 0.0f;
for (long long i = lo + threadIdx.x; i < hi; i += BLOCK) {
 float f[VEC];
 load_chunk(xg, i, f);
#pragma unroll
 for (int j = 0; j < VEC; ++j) { sum += f[j]; }
}
const float mean = reduce_all(Sum{sum}, red, &part).s / (float)len;
float sq = 0.0f;
for (long long i = lo + threadIdx.x; i < hi; i += BLOCK) {
 float f[VEC];
 load_chunk(xg, i, f);
#pragma unroll
 for (int j = 0; j < VEC; ++j) { const float d = f[j] - mean; sq += d * d; }
}
const float rstd = rsqrtf(reduce_all(Sum{sq}, red, &part).s / (float)len + 1e-5f);
"""
        if split > 1:
            cluster = """#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// Block result, then the SPLIT blocks of the cluster merge theirs in rank order (all get the same).
template <typename S>
__device__ __forceinline__ S reduce_all(S v, S* red, S* part) {
    v = group_reduce<BLOCK>(v, red);
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) {
        *part = v;
    }
    cluster.sync();
    v = *cluster.map_shared_rank(part, 0);
#pragma unroll
    for (int r = 1; r < SPLIT; ++r) {
        v = S::combine(v, *cluster.map_shared_rank(part, r));
    }
    cluster.sync();  // no block may reuse or release part while another still reads it
    return v;
}
"""
            # Before __global__: the source check's CUDA grammar misreads it after the return type.
            attribute = f"__cluster_dims__({split}, 1, 1) "
        else:
            cluster = """template <typename S>
__device__ __forceinline__ S reduce_all(S v, S* red, S*) {
    return group_reduce<BLOCK>(v, red);
}
"""
            attribute = ""
        stat_params, stat_writes = "", ""
        if len(card.outputs) == 3:  # the statistics aten.native_group_norm returns beside y, rounded like y
            stat_params = "\n    T* __restrict__ mean_out, T* __restrict__ rstd_out,"
            stat_writes = (
                "if (rank == 0 && threadIdx.x == 0) { mean_out[gid] = from_f(mean); rstd_out[gid] = from_f(rstd); }\n"
            )
        source = f"""// group_norm ({dtype}, fp32 math): {split} block(s) per group,
// {vec}-element vectors, {state} statistics.
// Generated by the template proposer.
{prelude(dtype, vec)}#define BLOCK {block}
#define SPLIT {split}
{reduce_helpers(True)}
{cluster}
extern "C" {attribute}__global__ void {launch_bounds(block, 1)} {self.entry}(
    const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta, T* __restrict__ y,{stat_params}
    int c, int hw, int groups) {{
__shared__ {state} red[32];
__shared__ {state} part;
const int cpg = c / groups;
const long long len = (long long)cpg * hw;
const long long gid = blockIdx.x / SPLIT;
const int rank = blockIdx.x % SPLIT;
const long long nchunk = len / VEC;
const long long lo = nchunk * rank / SPLIT;
const long long hi = nchunk * (rank + 1) / SPLIT;
const T* __restrict__ xg = x + gid * len;
T* __restrict__ yg = y + gid * len;
const int c0 = (int)(gid % groups) * cpg;
{stats}{stat_writes}for (long long i = lo + threadIdx.x; i < hi; i += BLOCK) {{
 float f[VEC];
 load_chunk(xg, i, f);
 const int ch = c0 + (int)(i * VEC / hw);
 const float g = to_f(gamma[ch]) * rstd;
 const float b = to_f(beta[ch]);
#pragma unroll
 for (int j = 0; j < VEC; ++j) {{ f[j] = fmaf(f[j] - mean, g, b); }}
 store_chunk(yg, i, f);
}}
}}
"""
        names = [t.name for t in [*card.inputs, *card.outputs]]
        plan = LaunchPlan(
            entry=self.entry,
            grid=[f"n * groups * {split}"],
            block=[block],
            args=[*names, "c", "h * w", "groups"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        vec = max(vec_widths(dtype_of(card)))
        return [
            {"block": 512, "vec": vec, "split": 1, "welford": 1},
            {"block": 256, "vec": vec, "split": 4, "welford": 1},
            {"block": 1024, "vec": vec, "split": 2, "welford": 0},
            {"block": 256, "vec": 1, "split": 8, "welford": 1},
        ]
