// softmax candidate (fp32): one block per row, the row kept in registers, so x is read from memory
// exactly once and y written once (the minimum traffic). 16-byte float4 loads and stores, max and sum
// reduced with warp shuffles and a 32-slot shared array, exp through the fast ex2 unit (__expf:
// relative error a few 1e-6 for the arguments softmax sees, well inside fp32's rtol 1e-5).
//
// Paths, chosen per row (uniformly for the whole block):
//   - both row pointers 16-byte aligned and cols <= blockDim.x * MAXV * 4: float4 loads into
//     registers, the last cols % 4 elements handled by threads 0..2 as scalars;
//   - not aligned (cols not a multiple of 4 makes every other row misaligned), same capacity:
//     scalar loads into registers;
//   - longer rows: an online (running max, rescaled sum) pass, then a second read to write y.
// Plan: grid = rows, block = any multiple of 32 up to 1024 (1024 for cols = 32768: 8 float4 each).
#include <stdint.h>

#define VEC 4
#define MAXV 8
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

extern "C" __global__ void __launch_bounds__(1024) softmax_block_row_f32(const float* __restrict__ x,
                                                                         float* __restrict__ y, int rows,
                                                                         int cols) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return;  // uniform for the whole block
    }
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    const int tid = threadIdx.x;
    const int bs = blockDim.x;
    const bool fits = cols <= bs * (MAXV * VEC);
    const bool aligned =
        ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr)) & 15) == 0;

    if (fits && aligned) {
        const int nvec = cols / VEC;
        const int rem = cols - nvec * VEC;  // 0..3 tail elements, one per thread 0..rem-1
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* y4 = reinterpret_cast<float4*>(yr);
        float v[MAXV][VEC];
        float m = NEG_INF;
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
            const int i = tid + k * bs;
            if (i < nvec) {
                const float4 t = __ldg(x4 + i);
                v[k][0] = t.x;
                v[k][1] = t.y;
                v[k][2] = t.z;
                v[k][3] = t.w;
            } else {
                v[k][0] = v[k][1] = v[k][2] = v[k][3] = NEG_INF;
            }
            m = fmaxf(m, fmaxf(fmaxf(v[k][0], v[k][1]), fmaxf(v[k][2], v[k][3])));
        }
        float tail = NEG_INF;
        if (tid < rem) {
            tail = __ldg(xr + nvec * VEC + tid);
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
                y4[i] = make_float4(v[k][0] * inv, v[k][1] * inv, v[k][2] * inv, v[k][3] * inv);
            }
        }
        if (tid < rem) {
            yr[nvec * VEC + tid] = tail * inv;
        }
    } else if (fits) {
        float v[MAXV * VEC];
        float m = NEG_INF;
#pragma unroll
        for (int k = 0; k < MAXV * VEC; ++k) {
            const int i = tid + k * bs;
            v[k] = i < cols ? __ldg(xr + i) : NEG_INF;
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
                yr[i] = v[k] * inv;
            }
        }
    } else {
        // Online softmax: each thread keeps a running max m and a sum s of exp(x - m).
        float m = NEG_INF;
        float s = 0.0f;
        for (int i = tid; i < cols; i += bs) {
            const float t = __ldg(xr + i);
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
            yr[i] = __expf(__ldg(xr + i) - bm) * inv;
        }
    }
}
