//@ y = op(a0[, a1]) element by element, one thread per element: $expression is the op's fp32 expression over a0 (and
//@ a1), ELEMENTWISE in baselines.py.
#include "prelude.cuh"

//@if binary
extern "C" __global__ void kf_capture_elementwise(const T* __restrict__ $in0, const T* __restrict__ $in1, T* __restrict__ $output, long long n) {
//@else
extern "C" __global__ void kf_capture_elementwise(const T* __restrict__ $in0, T* __restrict__ $output, long long n) {
//@end
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) {
        const float a0 = ld($in0, i);
//@if binary
        const float a1 = ld($in1, i);
//@end
        $output[i] = cv($expression);
    }
}
