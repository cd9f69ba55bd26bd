//@ Group norm over NCHW with the statistics mean and rstd [n, groups] (aten.native_group_norm returns them beside y):
//@ a block per (sample, group), two-pass variance of x shifted by the group's first element. With `act`, y is the
//@ activation ($expression over a0) of the normalised value, and the statistics are not written (a fused chain's
//@ group norm, whose mean and rstd nothing reads); with `rounded`, of the normalised value as eager stores it, in T.
#include "prelude.cuh"

#include "block_reduce.cuh"
//@if rounded
#include "rounded.cuh"
//@end

//@if act
extern "C" __global__ void kf_capture_group_norm(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                                   T* __restrict__ y, int c, int hw, int groups) {
//@else
extern "C" __global__ void kf_capture_group_norm(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                                   T* __restrict__ y, T* __restrict__ mean, T* __restrict__ rstd_out, int c, int hw,
                                   int groups) {
//@end
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
//@if act
//@else
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = cv(shift + offset);
        rstd_out[blockIdx.x] = cv(rstd);
    }
//@end
    for (long long k = threadIdx.x; k < span; k += BLOCK) {
        const int ch = first_channel + (int)(k / hw);
//@if act
//@if rounded
        const float a0 = rd(((ld(x, base + k) - shift) - offset) * rstd * ld(gamma, ch) + ld(beta, ch));
//@else
        const float a0 = ((ld(x, base + k) - shift) - offset) * rstd * ld(gamma, ch) + ld(beta, ch);
//@end
        y[base + k] = cv($expression);
//@else
        y[base + k] = cv(((ld(x, base + k) - shift) - offset) * rstd * ld(gamma, ch) + ld(beta, ch));
//@end
    }
}
