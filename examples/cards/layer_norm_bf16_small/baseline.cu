// layer_norm baseline (fp32 or bf16 in and out, fp32 math): deliberately naive. One thread per row, three
// passes over the row (mean, centred sum of squares, write), scalar loads, eps 1e-5. Two passes, so the
// variance never cancels (no E[x^2] - E[x]^2).
// Plan: grid = cdiv(rows, 32), block = 32. Correct for any rows and cols.
#include <cuda_bf16.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__device__ void layer_norm_naive(const T* x, const T* w, const T* b, T* y, int rows, int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) {
        return;
    }
    const T* xr = x + (long long)row * cols;
    T* yr = y + (long long)row * cols;
    float sum = 0.0f;
    for (int j = 0; j < cols; ++j) {
        sum += to_f(xr[j]);
    }
    const float mean = sum / (float)cols;
    float sq = 0.0f;
    for (int j = 0; j < cols; ++j) {
        const float d = to_f(xr[j]) - mean;
        sq += d * d;
    }
    const float rstd = rsqrtf(sq / (float)cols + 1e-5f);
    for (int j = 0; j < cols; ++j) {
        store(yr + j, (to_f(xr[j]) - mean) * rstd * to_f(w[j]) + to_f(b[j]));
    }
}

extern "C" __global__ void layer_norm_naive_f32(const float* x, const float* w, const float* b, float* y, int rows,
                                                int cols) {
    layer_norm_naive(x, w, b, y, rows, cols);
}

extern "C" __global__ void layer_norm_naive_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                                 const __nv_bfloat16* b, __nv_bfloat16* y, int rows, int cols) {
    layer_norm_naive(x, w, b, y, rows, cols);
}
