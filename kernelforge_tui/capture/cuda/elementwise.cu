//@ y = op(a0[, a1]) element by element, one thread per element: $expression is the op's fp32 expression over a0 (and
//@ a1), ELEMENTWISE in baselines.py. With `bias`, a0 is in0 plus in1 along the last axis (cols of them): a fused
//@ chain's bias add before its activation, the sum kept in fp32 (with `rounded`, as eager stores it, in T).
#include "prelude.cuh"
//@if rounded
#include "rounded.cuh"
//@end

//@if bias
extern "C" __global__ void kf_capture_elementwise(const T* __restrict__ $in0, const T* __restrict__ $in1, T* __restrict__ $output, long long n,
                                   int cols) {
//@else
//@if binary
extern "C" __global__ void kf_capture_elementwise(const T* __restrict__ $in0, const T* __restrict__ $in1, T* __restrict__ $output, long long n) {
//@else
extern "C" __global__ void kf_capture_elementwise(const T* __restrict__ $in0, T* __restrict__ $output, long long n) {
//@end
//@end
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) {
//@if bias
//@if rounded
        const float a0 = rd(ld($in0, i) + ld($in1, i % cols));
//@else
        const float a0 = ld($in0, i) + ld($in1, i % cols);
//@end
//@else
        const float a0 = ld($in0, i);
//@end
//@if binary
        const float a1 = ld($in1, i);
//@end
        $output[i] = cv($expression);
    }
}
