//@ Adaptive average pooling to 1x1: y[n, c] = mean of the plane x[n, c, :, :], a thread per plane, fp32 sum.
#include "prelude.cuh"

extern "C" __global__ void kf_capture_avg_pool(const T* __restrict__ x, T* __restrict__ y, long long planes, int hw) {
    const long long p = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (p < planes) {
        float s = 0.0f;
        for (int k = 0; k < hw; ++k) {
            s += ld(x, p * hw + k);
        }
        y[p] = cv(s / (float)hw);
    }
}
