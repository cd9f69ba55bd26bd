//@ y = x * rsqrt(mean(x^2) + eps) * w over the rows of x[rows, cols], a block per row. With `residual`, of the sum
//@ x + r of two such tensors, kept in fp32 (residual_row.cuh); with `kept`, the sum is written out too (the card's s).
#include "prelude.cuh"

#include "block_reduce.cuh"
//@if residual
#include "residual_row.cuh"

//@if kept
extern "C" __global__ void kf_capture_rms_norm(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w,
                                   T* __restrict__ sum, T* __restrict__ y, int rows, int cols) {
    T* sr = sum + (long long)blockIdx.x * cols;
//@else
extern "C" __global__ void kf_capture_rms_norm(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w,
                                   T* __restrict__ y, int rows, int cols) {
//@end
    __shared__ float sh[BLOCK];
    const SumRow xr{x + (long long)blockIdx.x * cols, r + (long long)blockIdx.x * cols};
//@else

extern "C" __global__ void kf_capture_rms_norm(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows,
                                   int cols) {
    __shared__ float sh[BLOCK];
    const T* xr = x + (long long)blockIdx.x * cols;
//@end
    T* yr = y + (long long)blockIdx.x * cols;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {
        const float v = ld(xr, j);
        ss += v * v;
//@if kept
        sr[j] = cv(v);
//@end
    }
    const float inv = rsqrtf(block_sum(ss, sh) / (float)cols + $eps);
    for (int j = threadIdx.x; j < cols; j += BLOCK) {
        yr[j] = cv(ld(xr, j) * inv * ld(w, j));
    }
}
