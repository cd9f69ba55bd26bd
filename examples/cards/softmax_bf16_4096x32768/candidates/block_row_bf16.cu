// softmax candidate (bf16 in and out, fp32 math): one block per row, the row kept in registers as
// fp32, so x is read from memory exactly once and y written once (the minimum traffic). 16-byte
// loads and stores (8 bf16 each), warp-shuffle reductions for max and sum, fast exp (__expf).
//
// Paths, chosen per row (uniformly for the whole block):
//   - both row pointers 16-byte aligned and cols <= blockDim.x * MAXV * 8: 16-byte loads into
//     registers, the last cols % 8 elements handled by threads 0..6 as scalars;
//   - not aligned (cols not a multiple of 8 makes most rows misaligned), same capacity:
//     scalar loads into registers;
//   - longer rows: an online (running max, rescaled sum) pass, then a second read to write y.
// Plan: grid = rows, block = any multiple of 32 up to 1024 (1024 for cols = 32768: 4 vectors each).
#include <cuda_bf16.h>
#include <stdint.h>

#define VEC 8
#define MAXV 4
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// Every thread of the block calls these; every thread gets the block-wide result.
__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();
    v = warp_max(lane < nwarps ? red[lane] : NEG_INF);
    __syncthreads();  // red may be reused by the next reduction
    return v;
}

__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();
    v = warp_sum(lane < nwarps ? red[lane] : 0.0f);
    __syncthreads();
    return v;
}

extern "C" __global__ void __launch_bounds__(1024) softmax_block_row_bf16(const __nv_bfloat16* __restrict__ x,
                                                                          __nv_bfloat16* __restrict__ y,
                                                                          int rows, int cols) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return;  // uniform for the whole block
    }
    const __nv_bfloat16* xr = x + (long long)row * cols;
    __nv_bfloat16* yr = y + (long long)row * cols;
    const int tid = threadIdx.x;
    const int bs = blockDim.x;
    const bool fits = cols <= bs * (MAXV * VEC);
    const bool aligned =
        ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr)) & 15) == 0;

    if (fits && aligned) {
        const int nvec = cols / VEC;
        const int rem = cols - nvec * VEC;  // 0..7 tail elements, one per thread 0..rem-1
        const uint4* x16 = reinterpret_cast<const uint4*>(xr);
        uint4* y16 = reinterpret_cast<uint4*>(yr);
        float v[MAXV][VEC];
        float m = NEG_INF;
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
            const int i = tid + k * bs;
            if (i < nvec) {
                const uint4 raw = __ldg(x16 + i);
                const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
                for (int j = 0; j < VEC / 2; ++j) {
                    const float2 f = __bfloat1622float2(h[j]);
                    v[k][2 * j] = f.x;
                    v[k][2 * j + 1] = f.y;
                }
            } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    v[k][j] = NEG_INF;
                }
            }
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                m = fmaxf(m, v[k][j]);
            }
        }
        float tail = NEG_INF;
        if (tid < rem) {
            tail = __bfloat162float(xr[nvec * VEC + tid]);
            m = fmaxf(m, tail);
        }
        m = block_max(m, red);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                v[k][j] = __expf(v[k][j] - m);  // padding: exp(-inf) = 0
                s += v[k][j];
            }
        }
        tail = __expf(tail - m);
        s += tail;
        const float inv = 1.0f / block_sum(s, red);
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
            const int i = tid + k * bs;
            if (i < nvec) {
                uint4 raw;
                __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
                for (int j = 0; j < VEC / 2; ++j) {
                    h[j] = __floats2bfloat162_rn(v[k][2 * j] * inv, v[k][2 * j + 1] * inv);
                }
                y16[i] = raw;
            }
        }
        if (tid < rem) {
            yr[nvec * VEC + tid] = __float2bfloat16_rn(tail * inv);
        }
    } else if (fits) {
        float v[MAXV * VEC];
        float m = NEG_INF;
#pragma unroll
        for (int k = 0; k < MAXV * VEC; ++k) {
            const int i = tid + k * bs;
            v[k] = i < cols ? __bfloat162float(xr[i]) : NEG_INF;
            m = fmaxf(m, v[k]);
        }
        m = block_max(m, red);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < MAXV * VEC; ++k) {
            v[k] = __expf(v[k] - m);
            s += v[k];
        }
        const float inv = 1.0f / block_sum(s, red);
#pragma unroll
        for (int k = 0; k < MAXV * VEC; ++k) {
            const int i = tid + k * bs;
            if (i < cols) {
                yr[i] = __float2bfloat16_rn(v[k] * inv);
            }
        }
    } else {
        // Online softmax: each thread keeps a running max m and a sum s of exp(x - m).
        float m = NEG_INF;
        float s = 0.0f;
        for (int i = tid; i < cols; i += bs) {
            const float t = __bfloat162float(xr[i]);
            if (t > m) {
                s = s * __expf(m - t) + 1.0f;  // first element: 0 * exp(-inf) + 1
                m = t;
            } else if (t != NEG_INF) {  // a masked entry adds exp(-inf) = 0; -inf - -inf would be NaN
                s += __expf(t - m);
            }
        }
        const float bm = block_max(m, red);
        const float part = m == NEG_INF ? 0.0f : s * __expf(m - bm);
        const float inv = 1.0f / block_sum(part, red);
        for (int i = tid; i < cols; i += bs) {
            yr[i] = __float2bfloat16_rn(__expf(__bfloat162float(xr[i]) - bm) * inv);
        }
    }
}
