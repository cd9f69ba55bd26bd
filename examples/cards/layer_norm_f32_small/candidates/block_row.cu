// layer_norm candidate (fp32 or bf16, fp32 math): one block per row, the row kept in registers (x read
// once), mean then the centred sum of squares (two reductions, no cancellation), warp-shuffle reductions
// through a 32-slot shared array. Scalar loads: with odd cols most rows are not 16-byte aligned.
// Rows longer than blockDim.x * MAXV are read again from memory instead of kept.
// Plan: grid = rows, block = any multiple of 32 up to 1024.
#include <cuda_bf16.h>

#define MAXV 8
#define EPS 1e-5f

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Every thread of the block calls it and gets the block-wide sum.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    __syncthreads();  // red is reused by the next reduction
    return v;
}

template <typename T>
__device__ void layer_norm_block_row(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                     T* __restrict__ y, int rows, int cols) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return;  // uniform for the whole block
    }
    const T* xr = x + (long long)row * cols;
    T* yr = y + (long long)row * cols;
    const int tid = threadIdx.x;
    const int bs = blockDim.x;
    const bool fits = cols <= bs * MAXV;
    float v[MAXV];
    float sum = 0.0f;
    if (fits) {
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
            const int i = tid + k * bs;
            v[k] = i < cols ? to_f(xr[i]) : 0.0f;
            sum += v[k];
        }
    } else {
        for (int i = tid; i < cols; i += bs) {
            sum += to_f(xr[i]);
        }
    }
    const float mean = block_sum(sum, red) / (float)cols;
    float sq = 0.0f;
    if (fits) {
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
            const float d = tid + k * bs < cols ? v[k] - mean : 0.0f;
            sq += d * d;
        }
    } else {
        for (int i = tid; i < cols; i += bs) {
            const float d = to_f(xr[i]) - mean;
            sq += d * d;
        }
    }
    const float rstd = rsqrtf(block_sum(sq, red) / (float)cols + EPS);
    if (fits) {
#pragma unroll
        for (int k = 0; k < MAXV; ++k) {
            const int i = tid + k * bs;
            if (i < cols) {
                store(yr + i, (v[k] - mean) * rstd * to_f(w[i]) + to_f(b[i]));
            }
        }
    } else {
        for (int i = tid; i < cols; i += bs) {
            store(yr + i, (to_f(xr[i]) - mean) * rstd * to_f(w[i]) + to_f(b[i]));
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024) layer_norm_block_row_f32(const float* __restrict__ x,
                                                                            const float* __restrict__ w,
                                                                            const float* __restrict__ b,
                                                                            float* __restrict__ y, int rows,
                                                                            int cols) {
    layer_norm_block_row(x, w, b, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(1024) layer_norm_block_row_bf16(const __nv_bfloat16* __restrict__ x,
                                                                             const __nv_bfloat16* __restrict__ w,
                                                                             const __nv_bfloat16* __restrict__ b,
                                                                             __nv_bfloat16* __restrict__ y,
                                                                             int rows, int cols) {
    layer_norm_block_row(x, w, b, y, rows, cols);
}
