//@ Inference batch norm: y = (x - mean[c]) * rsqrt(var[c] + eps) * w[c] + b[c] over x[n, c, hw], a thread per
//@ element. With `chained` (a fused chain's), y = act(that [+ r] with `residual`), x as it lies in memory: the
//@ channel of element i is (i / hw) % c, where the launch passes 1 as hw for channels-last; `rounded` keeps each
//@ result in T, as eager stores it.
#include "prelude.cuh"
//@if rounded
#include "rounded.cuh"
//@end

//@if residual
extern "C" __global__ void kf_capture_batch_norm(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   const T* __restrict__ mean, const T* __restrict__ var, const T* __restrict__ r,
                                   T* __restrict__ y, long long total, int c, int hw) {
//@else
extern "C" __global__ void kf_capture_batch_norm(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   const T* __restrict__ mean, const T* __restrict__ var, T* __restrict__ y,
                                   long long total, int c, int hw) {
//@end
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < total) {
        const int ch = (int)((i / hw) % c);
        const float rstd = rsqrtf(ld(var, ch) + $eps);
//@if chained
//@if rounded
        float a0 = rd((ld(x, i) - ld(mean, ch)) * rstd * ld(w, ch) + ld(b, ch));
//@if residual
        a0 = rd(a0 + ld(r, i));
//@end
//@else
        float a0 = (ld(x, i) - ld(mean, ch)) * rstd * ld(w, ch) + ld(b, ch);
//@if residual
        a0 += ld(r, i);
//@end
//@end
        y[i] = cv($expression);
//@else
        y[i] = cv((ld(x, i) - ld(mean, ch)) * rstd * ld(w, ch) + ld(b, ch));
//@end
    }
}
