//@ Suite task batch_norm's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#include "block_reduce.cuh"

// A block per channel (a thread per channel would loop over n*h*w = 65536 elements alone at 2^22): each thread
// sums a strided share of the channel's n planes, a shared-memory tree adds the shares (block_sum); two passes,
// the mean, then the centred sum of squares (biased variance, as torch normalises with); then the write. eps 1e-5.
extern "C" __global__ void batch_norm_naive(const T* x, const T* weight, const T* bias, T* y, int n, int c, int hw) {
    __shared__ float sh[BLOCK];
    const int ch = blockIdx.x;
    const long long count = (long long)n * hw;
    float s = 0.0f;
    for (long long k = threadIdx.x; k < count; k += BLOCK) {
        s += ld(x, ((k / hw) * c + ch) * hw + k % hw);
    }
    const float mean = block_sum(s, sh) / (float)count;
    float sq = 0.0f;
    for (long long k = threadIdx.x; k < count; k += BLOCK) {
        const float d = ld(x, ((k / hw) * c + ch) * hw + k % hw) - mean;
        sq += d * d;
    }
    const float rstd = rsqrtf(block_sum(sq, sh) / (float)count + 1e-5f);
    const float scale = rstd * ld(weight, ch), shift = ld(bias, ch);
    for (long long k = threadIdx.x; k < count; k += BLOCK) {
        const long long i = ((k / hw) * c + ch) * hw + k % hw;
        y[i] = cv((ld(x, i) - mean) * scale + shift);
    }
}
