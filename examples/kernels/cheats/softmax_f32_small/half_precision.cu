// CHEAT half_precision: an fp32 softmax whose exp is computed in fp16 (hexp on half(x - max + 8), the
// e^8 scale cancelling in the normalisation): a precision downgrade, errors about 1e-3 relative where
// fp32 arithmetic errs about 1e-6.
// expect: mismatch -- fp32 tolerance (rtol 1e-5) must reject it.
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

extern "C" __global__ void half_precision_f32(const float* x, float* y, int rows, int cols) {
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        m = fmaxf(m, (xr[i]));
    }
    m = block_reduce(m, true, red);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float t = (xr[i]);
        s += __half2float(hexp(__float2half_rn(t - m + 8.0f)));
    }
    const float inv = 1.0f / block_reduce(s, false, red);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float t = (xr[i]);
        yr[i] = (__half2float(hexp(__float2half_rn(t - m + 8.0f))) * inv);
    }
}
