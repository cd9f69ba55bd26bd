"""Baseline kernels for captured cards: one straightforward, correct CUDA kernel per family and dtype.

Why these and not the template library's seeds: a card's baseline is what every speedup is measured against and what
proves a card can run at all, so it must be plainly right (fp32 math, the op's own eps baked in, NaN and inf
propagating as torch's do, any size) rather than fast. They are not deliberately slow either: the rows families use a
block per row with a shared-memory tree reduction, so that timing the baseline beside every candidate does not eat
the search's GPU budget on large captured shapes (a thread per row over a 1024-wide row is milliseconds).

Each function returns (source, plan) for a card whose tensors follow the family's naming (`families.py` makes them).
"""

from __future__ import annotations

from kernelforge_tui.cards.model import LaunchPlan

BLOCK = 256

HEADERS = {"float32": "", "bfloat16": "#include <cuda_bf16.h>\n", "float16": "#include <cuda_fp16.h>\n"}
C_TYPE = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
TO_F = {"float32": "v", "bfloat16": "__bfloat162float(v)", "float16": "__half2float(v)"}
FROM_F = {"float32": "v", "bfloat16": "__float2bfloat16_rn(v)", "float16": "__float2half_rn(v)"}
DTYPES = tuple(C_TYPE)
"""The dtypes a baseline exists for (one dtype for every tensor of a card)."""

ELEMENTWISE = {
    "add": (2, "a0 + a1"),
    "sub": (2, "a0 - a1"),
    "mul": (2, "a0 * a1"),
    "silu_mul": (2, "a0 / (1.0f + expf(-a0)) * a1"),
    "silu": (1, "a0 / (1.0f + expf(-a0))"),
    "relu": (1, "(a0 > 0.0f || a0 != a0) ? a0 : 0.0f"),
    "gelu": (1, "0.5f * a0 * (1.0f + erff(a0 * 0.70710678118654752f))"),
    "gelu_tanh": (1, "0.5f * a0 * (1.0f + tanhf(0.79788456080286536f * (a0 + 0.044715f * a0 * a0 * a0)))"),
}
"""Op name -> (arity, fp32 expression over a0, a1). relu keeps NaN as torch.relu does (fmaxf would make it 0)."""


def prelude(dtype: str, what: str, author: str = "`kernelforge capture`") -> str:
    """`T`, `ld` (to fp32) and `cv` (from fp32) for one dtype, under a comment saying what the kernel is."""
    return f"""// {what} ({dtype} in and out, fp32 math): the baseline {author} writes, plainly correct
// for any size, not tuned. Every speedup of a search on this card is measured against it.
{HEADERS[dtype]}typedef {C_TYPE[dtype]} T;
#define BLOCK {BLOCK}
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float ld(const T* p, long long i) {{
    const T v = p[i];
    return {TO_F[dtype]};
}}

__device__ __forceinline__ T cv(float v) {{ return {FROM_F[dtype]}; }}
"""


REDUCE = """
// Sum or max over the block (BLOCK threads, a power of two); every thread gets the result.
__device__ float block_sum(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            sh[threadIdx.x] += sh[threadIdx.x + s];
        }
        __syncthreads();
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}

__device__ float block_max(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        }
        __syncthreads();
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}
"""


def eps_literal(eps: float) -> str:
    """A C float literal for eps (repr is exact for the double; the f suffix rounds it as torch's fp32 math does)."""
    text = repr(float(eps))
    return text + ("f" if ("." in text or "e" in text) else ".0f")


def elementwise(op: str, dtype: str, inputs: list[str], output: str, count: str) -> tuple[str, LaunchPlan]:
    """y = op(a[, b]) element by element, one thread per element."""
    arity, expression = ELEMENTWISE[op]
    entry = "kf_capture_elementwise"
    params = ", ".join(
        [*(f"const T* __restrict__ {name}" for name in inputs), f"T* __restrict__ {output}", "long long n"]
    )
    loads = "".join(f"        const float a{k} = ld({name}, i);\n" for k, name in enumerate(inputs[:arity]))
    source = prelude(dtype, f"{op}, one thread per element") + (
        f"""
extern "C" __global__ void {entry}({params}) {{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) {{
{loads}        {output}[i] = cv({expression});
    }}
}}
"""
    )
    plan = LaunchPlan(
        entry=entry, grid=[f"cdiv({count}, {BLOCK})"], block=[BLOCK], args=[*inputs, output, f"{count}:i64"]
    )
    return source, plan


def softmax(dtype: str) -> tuple[str, LaunchPlan]:
    """y = softmax(x) over the rows of x[rows, cols]: a block per row, max, sum of exp, write."""
    entry = "kf_capture_softmax"
    source = (
        prelude(dtype, "softmax over the last axis, a block per row")
        + REDUCE
        + f"""
extern "C" __global__ void {entry}(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {{
    __shared__ float sh[BLOCK];
    const T* xr = x + (long long)blockIdx.x * cols;
    T* yr = y + (long long)blockIdx.x * cols;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {{
        m = fmaxf(m, ld(xr, j));
    }}
    m = block_max(m, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {{
        s += expf(ld(xr, j) - m);
    }}
    s = block_sum(s, sh);
    for (int j = threadIdx.x; j < cols; j += BLOCK) {{
        yr[j] = cv(expf(ld(xr, j) - m) / s);
    }}
}}
"""
    )
    return source, LaunchPlan(entry=entry, grid=["rows"], block=[BLOCK], args=["x", "y", "rows", "cols"])


def rms_norm(dtype: str, eps: float) -> tuple[str, LaunchPlan]:
    """y = x * rsqrt(mean(x^2) + eps) * w over the rows of x[rows, cols], w[cols]."""
    entry = "kf_capture_rms_norm"
    source = (
        prelude(dtype, f"rms_norm over the last axis, eps {eps!r}, a block per row")
        + REDUCE
        + f"""
extern "C" __global__ void {entry}(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows,
                                   int cols) {{
    __shared__ float sh[BLOCK];
    const T* xr = x + (long long)blockIdx.x * cols;
    T* yr = y + (long long)blockIdx.x * cols;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {{
        const float v = ld(xr, j);
        ss += v * v;
    }}
    const float inv = rsqrtf(block_sum(ss, sh) / (float)cols + {eps_literal(eps)});
    for (int j = threadIdx.x; j < cols; j += BLOCK) {{
        yr[j] = cv(ld(xr, j) * inv * ld(w, j));
    }}
}}
"""
    )
    return source, LaunchPlan(entry=entry, grid=["rows"], block=[BLOCK], args=["x", "w", "y", "rows", "cols"])


def layer_norm(dtype: str, eps: float) -> tuple[str, LaunchPlan]:
    """y = (x - mean) * rsqrt(var + eps) * w + b over the rows of x[rows, cols] (two passes: no cancellation)."""
    entry = "kf_capture_layer_norm"
    source = (
        prelude(dtype, f"layer_norm over the last axis, eps {eps!r}, a block per row, two-pass variance")
        + REDUCE
        + f"""
extern "C" __global__ void {entry}(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   T* __restrict__ y, int rows, int cols) {{
    __shared__ float sh[BLOCK];
    const T* xr = x + (long long)blockIdx.x * cols;
    T* yr = y + (long long)blockIdx.x * cols;
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {{
        s += ld(xr, j);
    }}
    const float mean = block_sum(s, sh) / (float)cols;
    float sq = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {{
        const float d = ld(xr, j) - mean;
        sq += d * d;
    }}
    const float rstd = rsqrtf(block_sum(sq, sh) / (float)cols + {eps_literal(eps)});
    for (int j = threadIdx.x; j < cols; j += BLOCK) {{
        yr[j] = cv((ld(xr, j) - mean) * rstd * ld(w, j) + ld(b, j));
    }}
}}
"""
    )
    return source, LaunchPlan(entry=entry, grid=["rows"], block=[BLOCK], args=["x", "w", "b", "y", "rows", "cols"])


def group_norm(dtype: str, eps: float) -> tuple[str, LaunchPlan]:
    """y = (x - mean) * rstd * gamma[c] + beta[c] with statistics per (sample, group) of x[n, c, h, w], and the
    statistics mean and rstd [n, groups] (aten.native_group_norm returns them beside y)."""
    entry = "kf_capture_group_norm"
    source = (
        prelude(
            dtype,
            f"group_norm over NCHW, eps {eps!r}, a block per (sample, group), two-pass variance of x shifted by the"
            " group's first element (a constant group then gives x - mean = 0 exactly, as the reference does)",
        )
        + REDUCE
        + f"""
extern "C" __global__ void {entry}(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                                   T* __restrict__ y, T* __restrict__ mean, T* __restrict__ rstd_out, int c, int hw,
                                   int groups) {{
    __shared__ float sh[BLOCK];
    const int per_group = c / groups;
    const long long span = (long long)per_group * hw;
    const long long base = (long long)blockIdx.x * span;
    const int first_channel = (blockIdx.x % groups) * per_group;
    const float shift = ld(x, base);
    float s = 0.0f;
    for (long long k = threadIdx.x; k < span; k += BLOCK) {{
        s += ld(x, base + k) - shift;
    }}
    const float offset = block_sum(s, sh) / (float)span;  // mean - shift
    float sq = 0.0f;
    for (long long k = threadIdx.x; k < span; k += BLOCK) {{
        const float d = (ld(x, base + k) - shift) - offset;
        sq += d * d;
    }}
    const float rstd = rsqrtf(block_sum(sq, sh) / (float)span + {eps_literal(eps)});
    if (threadIdx.x == 0) {{
        mean[blockIdx.x] = cv(shift + offset);
        rstd_out[blockIdx.x] = cv(rstd);
    }}
    for (long long k = threadIdx.x; k < span; k += BLOCK) {{
        const int ch = first_channel + (int)(k / hw);
        y[base + k] = cv(((ld(x, base + k) - shift) - offset) * rstd * ld(gamma, ch) + ld(beta, ch));
    }}
}}
"""
    )
    plan = LaunchPlan(
        entry=entry,
        grid=["n * groups"],
        block=[BLOCK],
        args=["x", "gamma", "beta", "y", "mean", "rstd", "c", "h * w", "groups"],
    )
    return source, plan


def pooling(dtype: str) -> tuple[str, LaunchPlan]:
    """y[n, c] = mean of the plane x[n, c, :, :]: a thread per plane, fp32 sum."""
    entry = "kf_capture_avg_pool"
    source = prelude(dtype, "adaptive average pooling to 1x1, a thread per plane") + (
        f"""
extern "C" __global__ void {entry}(const T* __restrict__ x, T* __restrict__ y, long long planes, int hw) {{
    const long long p = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (p < planes) {{
        float s = 0.0f;
        for (int k = 0; k < hw; ++k) {{
            s += ld(x, p * hw + k);
        }}
        y[p] = cv(s / (float)hw);
    }}
}}
"""
    )
    plan = LaunchPlan(entry=entry, grid=[f"cdiv(n * c, {BLOCK})"], block=[BLOCK], args=["x", "y", "n * c:i64", "h * w"])
    return source, plan


def batch_norm(dtype: str, eps: float) -> tuple[str, LaunchPlan]:
    """Inference batch norm: y = (x - mean[c]) * rsqrt(var[c] + eps) * w[c] + b[c] over x[n, c, hw]."""
    entry = "kf_capture_batch_norm"
    source = prelude(dtype, f"batch_norm in eval mode (running statistics), eps {eps!r}, a thread per element") + (
        f"""
extern "C" __global__ void {entry}(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   const T* __restrict__ mean, const T* __restrict__ var, T* __restrict__ y,
                                   long long total, int c, int hw) {{
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < total) {{
        const int ch = (int)((i / hw) % c);
        const float rstd = rsqrtf(ld(var, ch) + {eps_literal(eps)});
        y[i] = cv((ld(x, i) - ld(mean, ch)) * rstd * ld(w, ch) + ld(b, ch));
    }}
}}
"""
    )
    plan = LaunchPlan(
        entry=entry,
        grid=[f"cdiv(n * c * hw, {BLOCK})"],
        block=[BLOCK],
        args=["x", "w", "b", "mean", "var", "y", "n * c * hw:i64", "c", "hw"],
    )
    return source, plan
