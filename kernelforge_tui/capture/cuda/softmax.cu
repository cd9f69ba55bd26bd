//@ softmax over the last axis of x[rows, cols]: a block per row, max, sum of exp, write. With `fused`, of the logits
//@ x * scale (or x / scale) + mask[mask row] (logits_row.cuh), each part only where its `scaled` or `masked` says.
#include "prelude.cuh"

#include "block_reduce.cuh"
//@if fused
#include "logits_row.cuh"

//@if masked
extern "C" __global__ void kf_capture_softmax(const T* __restrict__ x, const T* __restrict__ mask, T* __restrict__ y, int rows,
                                   int cols, int heads_seq, int seq) {
    const long long row = blockIdx.x;
    const LogitsRow xr{x + row * cols, mask + (row / heads_seq * seq + row % seq) * cols};
//@else
extern "C" __global__ void kf_capture_softmax(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    const LogitsRow xr{x + (long long)blockIdx.x * cols, nullptr};
//@end
    __shared__ float sh[BLOCK];
//@else

extern "C" __global__ void kf_capture_softmax(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    __shared__ float sh[BLOCK];
    const T* xr = x + (long long)blockIdx.x * cols;
//@end
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
