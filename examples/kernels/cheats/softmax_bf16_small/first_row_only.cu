// CHEAT first_row_only: only row 0 is computed; the other blocks return at once.
// expect: mismatch -- rows 1.. keep their NaN poison; the whole output must be compared.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define NEG_INF __int_as_float(0xff800000)

// Block-wide max and sum (blockDim.x a multiple of 32); every thread gets the result.
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    if ((threadIdx.x & 31) == 0) {
        red[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : (is_max ? NEG_INF : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();
    return v;
}

extern "C" __global__ void cheat_first_row_only(const __nv_bfloat16* x, __nv_bfloat16* y, int rows, int cols) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    const __nv_bfloat16* xr = x + (long long)row * cols;
    __nv_bfloat16* yr = y + (long long)row * cols;
    if (row != 0) {
        return;
    }
    float m = NEG_INF;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        m = fmaxf(m, __bfloat162float(xr[i]));
    }
    m = block_reduce(m, true, red);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float t = __bfloat162float(xr[i]);
        s += __expf(t - m);
    }
    const float inv = 1.0f / block_reduce(s, false, red);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float t = __bfloat162float(xr[i]);
        yr[i] = __float2bfloat16_rn(__expf(t - m) * inv);
    }
}
