//@ y = (x - mean) * rsqrt(var + eps) * w + b over the rows of x[rows, cols], a block per row, two passes (no
//@ cancellation). With `residual`, of the sum x + r of two such tensors, kept in fp32 (residual_row.cuh); with
//@ `kept`, the sum is written out too (the card's s).
#include "prelude.cuh"

#include "block_reduce.cuh"
//@if residual
#include "residual_row.cuh"

//@if kept
extern "C" __global__ void kf_capture_layer_norm(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w,
                                   const T* __restrict__ b, T* __restrict__ sum, T* __restrict__ y, int rows, int cols) {
    T* sr = sum + (long long)blockIdx.x * cols;
//@else
extern "C" __global__ void kf_capture_layer_norm(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w,
                                   const T* __restrict__ b, T* __restrict__ y, int rows, int cols) {
//@end
    __shared__ float sh[BLOCK];
    const SumRow xr{x + (long long)blockIdx.x * cols, r + (long long)blockIdx.x * cols};
//@else

extern "C" __global__ void kf_capture_layer_norm(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   T* __restrict__ y, int rows, int cols) {
    __shared__ float sh[BLOCK];
    const T* xr = x + (long long)blockIdx.x * cols;
//@end
    T* yr = y + (long long)blockIdx.x * cols;
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {
//@if kept
        const float v = ld(xr, j);
        s += v;
        sr[j] = cv(v);
//@else
        s += ld(xr, j);
//@end
    }
    const float mean = block_sum(s, sh) / (float)cols;
    float sq = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {
        const float d = ld(xr, j) - mean;
        sq += d * d;
    }
    const float rstd = rsqrtf(block_sum(sq, sh) / (float)cols + $eps);
    for (int j = threadIdx.x; j < cols; j += BLOCK) {
        yr[j] = cv((ld(xr, j) - mean) * rstd * ld(w, j) + ld(b, j));
    }
}
