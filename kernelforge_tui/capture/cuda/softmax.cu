//@ softmax over the last axis of x[rows, cols]: a block per row, max, sum of exp, write.
#include "prelude.cuh"

#include "block_reduce.cuh"

extern "C" __global__ void kf_capture_softmax(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    __shared__ float sh[BLOCK];
    const T* xr = x + (long long)blockIdx.x * cols;
    T* yr = y + (long long)blockIdx.x * cols;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {
        m = fmaxf(m, ld(xr, j));
    }
    m = block_max(m, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += BLOCK) {
        s += expf(ld(xr, j) - m);
    }
    s = block_sum(s, sh);
    for (int j = threadIdx.x; j < cols; j += BLOCK) {
        yr[j] = cv(expf(ld(xr, j) - m) / s);
    }
}
