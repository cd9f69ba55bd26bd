//@ Group norm over NCHW with the statistics mean and rstd [n, groups] (aten.native_group_norm returns them beside y):
//@ a block per (sample, group), two-pass variance of x shifted by the group's first element.
#include "prelude.cuh"

#include "block_reduce.cuh"

extern "C" __global__ void kf_capture_group_norm(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                                   T* __restrict__ y, T* __restrict__ mean, T* __restrict__ rstd_out, int c, int hw,
                                   int groups) {
    __shared__ float sh[BLOCK];
    const int per_group = c / groups;
    const long long span = (long long)per_group * hw;
    const long long base = (long long)blockIdx.x * span;
    const int first_channel = (blockIdx.x % groups) * per_group;
    const float shift = ld(x, base);
    float s = 0.0f;
    for (long long k = threadIdx.x; k < span; k += BLOCK) {
        s += ld(x, base + k) - shift;
    }
    const float offset = block_sum(s, sh) / (float)span;  // mean - shift
    float sq = 0.0f;
    for (long long k = threadIdx.x; k < span; k += BLOCK) {
        const float d = (ld(x, base + k) - shift) - offset;
        sq += d * d;
    }
    const float rstd = rsqrtf(block_sum(sq, sh) / (float)span + $eps);
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = cv(shift + offset);
        rstd_out[blockIdx.x] = cv(rstd);
    }
    for (long long k = threadIdx.x; k < span; k += BLOCK) {
        const int ch = first_channel + (int)(k / hw);
        y[base + k] = cv(((ld(x, base + k) - shift) - offset) * rstd * ld(gamma, ch) + ld(beta, ch));
    }
}
