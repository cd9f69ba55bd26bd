// softmax baseline (bf16 in and out, fp32 math): deliberately naive. One thread per row, three passes
// over the row (max, sum of exponentials, write), accurate expf, scalar bf16 loads.
// Plan: grid = cdiv(rows, 32), block = 32. Correct for any rows and cols.
#include <cuda_bf16.h>

extern "C" __global__ void softmax_naive_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, int rows, int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) {
        return;
    }
    const __nv_bfloat16* xr = x + (long long)row * cols;
    __nv_bfloat16* yr = y + (long long)row * cols;
    float m = __bfloat162float(xr[0]);
    for (int j = 1; j < cols; ++j) {
        m = fmaxf(m, __bfloat162float(xr[j]));
    }
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) {
        s += expf(__bfloat162float(xr[j]) - m);
    }
    for (int j = 0; j < cols; ++j) {
        yr[j] = __float2bfloat16_rn(expf(__bfloat162float(xr[j]) - m) / s);
    }
}
