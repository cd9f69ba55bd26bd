// rms_norm baseline (bf16 in and out, fp32 math): deliberately naive. One thread per row, two passes
// over the row (sum of squares, then write), scalar bf16 loads, no cooperation between threads.
// y = x * rsqrt(mean(x^2) + eps) * w.  Plan: grid = cdiv(rows, 128), block = 128. Any rows and cols.
#include <cuda_bf16.h>

extern "C" __global__ void rms_norm_naive(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                                          int rows, int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) {
        return;
    }
    const __nv_bfloat16* xr = x + (long long)row * cols;
    __nv_bfloat16* yr = y + (long long)row * cols;
    float ss = 0.0f;
    for (int j = 0; j < cols; ++j) {
        const float v = __bfloat162float(xr[j]);
        ss += v * v;
    }
    const float inv = rsqrtf(ss / (float)cols + 1e-6f);
    for (int j = 0; j < cols; ++j) {
        yr[j] = __float2bfloat16_rn(__bfloat162float(xr[j]) * inv * __bfloat162float(w[j]));
    }
}
