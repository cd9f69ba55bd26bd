// rms_norm candidate (bf16 in and out, fp32 math): one block per row, the row kept in registers, so
// x is read exactly once and y written once; w (a few KB) stays in L2/L1 across rows. 16-byte loads
// and stores (8 bf16 each), the sum of squares reduced with warp shuffles and a 32-slot shared array.
// y = x * rsqrt(mean(x^2) + eps) * w, in the reference's order: (x * inv) * w.
//
// Paths, chosen per row (uniformly for the whole block):
//   - x row, y row and w 16-byte aligned and cols <= blockDim.x * MAXV * 8: 16-byte accesses,
//     the last cols % 8 elements handled by threads 0..6 as scalars;
//   - not aligned (cols not a multiple of 8 makes most rows misaligned), same capacity: scalar
//     accesses, row in registers;
//   - longer rows: a sum-of-squares pass, then a second read to write y.
// Plan: grid = rows, block = any multiple of 32 up to 1024 (128 for cols = 4096: 4 vectors each,
// small blocks so that many rows are in flight on each SM).
#include <cuda_bf16.h>
#include <stdint.h>

#define VEC 8
#define MAXV 4
#define EPS 1e-6f

__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();
    v = lane < nwarps ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;  // called once per block: no second barrier needed
}

extern "C" __global__ void __launch_bounds__(1024) rms_norm_block_row(const __nv_bfloat16* __restrict__ x,
                                                                      const __nv_bfloat16* __restrict__ w,
                                                                      __nv_bfloat16* __restrict__ y, int rows,
                                                                      int cols) {
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
    const bool aligned = ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr) |
                           reinterpret_cast<uintptr_t>(w)) & 15) == 0;

    if (fits && aligned) {
        const int nvec = cols / VEC;
        const int rem = cols - nvec * VEC;  // 0..7 tail elements, one per thread 0..rem-1
        const uint4* x16 = reinterpret_cast<const uint4*>(xr);
        const uint4* w16 = reinterpret_cast<const uint4*>(w);
        uint4* y16 = reinterpret_cast<uint4*>(yr);
        float v[MAXV][VEC];
        float ss = 0.0f;
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
                    v[k][j] = 0.0f;
                }
            }
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                ss += v[k][j] * v[k][j];
            }
        }
        float tail = 0.0f;
        if (tid < rem) {
            tail = __bfloat162float(xr[nvec * VEC + tid]);
            ss += tail * tail;
        }
        const float inv = rsqrtf(block_sum(ss, red) / (float)cols + EPS);
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
            const int i = tid + k * bs;
            if (i < nvec) {
                const uint4 wraw = __ldg(w16 + i);
                const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&wraw);
                uint4 raw;
                __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
                for (int j = 0; j < VEC / 2; ++j) {
                    const float2 wf = __bfloat1622float2(wh[j]);
                    h[j] = __floats2bfloat162_rn(v[k][2 * j] * inv * wf.x, v[k][2 * j + 1] * inv * wf.y);
                }
                y16[i] = raw;
            }
        }
        if (tid < rem) {
            const int j = nvec * VEC + tid;
            yr[j] = __float2bfloat16_rn(tail * inv * __bfloat162float(w[j]));
        }
    } else if (fits) {
        float v[MAXV * VEC];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < MAXV * VEC; ++k) {
            const int i = tid + k * bs;
            v[k] = i < cols ? __bfloat162float(xr[i]) : 0.0f;
            ss += v[k] * v[k];
        }
        const float inv = rsqrtf(block_sum(ss, red) / (float)cols + EPS);
#pragma unroll
        for (int k = 0; k < MAXV * VEC; ++k) {
            const int i = tid + k * bs;
            if (i < cols) {
                yr[i] = __float2bfloat16_rn(v[k] * inv * __bfloat162float(w[i]));
            }
        }
    } else {
        float ss = 0.0f;
        for (int i = tid; i < cols; i += bs) {
            const float t = __bfloat162float(xr[i]);
            ss += t * t;
        }
        const float inv = rsqrtf(block_sum(ss, red) / (float)cols + EPS);
        for (int i = tid; i < cols; i += bs) {
            yr[i] = __float2bfloat16_rn(__bfloat162float(xr[i]) * inv * __bfloat162float(w[i]));
        }
    }
}
