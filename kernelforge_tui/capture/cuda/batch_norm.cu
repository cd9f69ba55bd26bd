//@ Inference batch norm: y = (x - mean[c]) * rsqrt(var[c] + eps) * w[c] + b[c] over x[n, c, hw], a thread per
//@ element.
#include "prelude.cuh"

extern "C" __global__ void kf_capture_batch_norm(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   const T* __restrict__ mean, const T* __restrict__ var, T* __restrict__ y,
                                   long long total, int c, int hw) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < total) {
        const int ch = (int)((i / hw) % c);
        const float rstd = rsqrtf(ld(var, ch) + $eps);
        y[i] = cv((ld(x, i) - ld(mean, ch)) * rstd * ld(w, ch) + ld(b, ch));
    }
}
