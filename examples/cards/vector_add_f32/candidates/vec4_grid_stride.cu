// vector_add_f32 candidate: 16-byte (float4) loads and stores, a grid-stride loop over one wave of
// resident blocks, read-only cache loads, and a scalar tail for n % 4. Falls back to scalar
// accesses when a pointer is not 16-byte aligned, so it is correct for every n and every buffer.
#include <stdint.h>

extern "C" __global__ void __launch_bounds__(256) vector_add_vec4(const float* __restrict__ a,
                                                                  const float* __restrict__ b,
                                                                  float* __restrict__ c, long long n) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool aligned = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                           reinterpret_cast<uintptr_t>(c)) & 15) == 0;
    long long done = 0;
    if (aligned) {
        const long long nvec = n / 4;
        const float4* a4 = reinterpret_cast<const float4*>(a);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        float4* c4 = reinterpret_cast<float4*>(c);
        for (long long i = tid; i < nvec; i += stride) {
            const float4 x = __ldg(a4 + i);
            const float4 y = __ldg(b4 + i);
            c4[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        }
        done = nvec * 4;
    }
    for (long long i = done + tid; i < n; i += stride) {
        c[i] = a[i] + b[i];
    }
}
