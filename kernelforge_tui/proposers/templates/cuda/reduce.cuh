//@ The reduction states and group_reduce. `red` arrays are `__shared__ S red[32]`; EXPF is the exp the kernel
//@ chose (fast __expf or accurate expf).
#define EXPF $expf

#define FULL_MASK 0xffffffffu

// Reduction states: combine() must be exact for Sum/Max; group_reduce broadcasts one lane's result so
// that every thread of a group holds bit-identical statistics even for the non-commutative ones.
struct Sum {
    float s;
    __device__ static Sum combine(Sum a, Sum b) { return {a.s + b.s}; }
    __device__ Sum shfl(int src, bool xr) const {
        return {xr ? __shfl_xor_sync(FULL_MASK, s, src) : __shfl_sync(FULL_MASK, s, src)};
    }
};

// Two sums in one reduction (group_norm's sum about its pivot and its plain sum, for the mean it outputs).
struct Sum2 {
    float s, t;
    __device__ static Sum2 combine(Sum2 a, Sum2 b) { return {a.s + b.s, a.t + b.t}; }
    __device__ Sum2 shfl(int src, bool xr) const {
        return xr ? Sum2{__shfl_xor_sync(FULL_MASK, s, src), __shfl_xor_sync(FULL_MASK, t, src)}
                  : Sum2{__shfl_sync(FULL_MASK, s, src), __shfl_sync(FULL_MASK, t, src)};
    }
};

// Three sums in one reduction (group_norm's shifted moments: the sum and squares about its pivot, and its plain sum).
struct Sum3 {
    float s, q, t;
    __device__ static Sum3 combine(Sum3 a, Sum3 b) { return {a.s + b.s, a.q + b.q, a.t + b.t}; }
    __device__ Sum3 shfl(int src, bool xr) const {
        return xr ? Sum3{__shfl_xor_sync(FULL_MASK, s, src), __shfl_xor_sync(FULL_MASK, q, src),
                         __shfl_xor_sync(FULL_MASK, t, src)}
                  : Sum3{__shfl_sync(FULL_MASK, s, src), __shfl_sync(FULL_MASK, q, src),
                         __shfl_sync(FULL_MASK, t, src)};
    }
};

struct Max {
    float m;
    __device__ static Max combine(Max a, Max b) { return {fmaxf(a.m, b.m)}; }
    __device__ Max shfl(int src, bool xr) const {
        return {xr ? __shfl_xor_sync(FULL_MASK, m, src) : __shfl_sync(FULL_MASK, m, src)};
    }
};

// Online softmax state: running max m and sum s of exp(x - m).
struct MaxSum {
    float m, s;
    __device__ static MaxSum combine(MaxSum a, MaxSum b) {
        const float m = fmaxf(a.m, b.m);
        if (m == NEG_INF) {
            return {m, 0.0f};
        }
        return {m, a.s * EXPF(a.m - m) + b.s * EXPF(b.m - m)};
    }
    __device__ MaxSum shfl(int src, bool xr) const {
        return xr ? MaxSum{__shfl_xor_sync(FULL_MASK, m, src), __shfl_xor_sync(FULL_MASK, s, src)}
                  : MaxSum{__shfl_sync(FULL_MASK, m, src), __shfl_sync(FULL_MASK, s, src)};
    }
};

// Welford state (count, mean, sum of squared deviations), merged with Chan's formula, and the plain sum beside it.
// Chan's merged mean rounds at every merge by the size of the parts' means: fine to centre on, but a mean near zero
// of large values misses its own tolerance that way (fp32 group_norm's mean output failed stress:large so on the
// H200). sum_mean() is the sum over the count, which rounds as the two-pass kernels' sums do.
struct Welford {
    float n, mean, m2, s;
    __device__ __forceinline__ float sum_mean() const { return n > 0.0f ? s / n : 0.0f; }
    // One chunk of V values: its mean and the squares about it (two passes over registers), and its sum.
    template <int V>
    __device__ static Welford of_chunk(const float (&f)[V]) {
        float s = 0.0f, m2 = 0.0f;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            s += f[j];
        }
        const float mean = s * (1.0f / V);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const float d = f[j] - mean;
            m2 += d * d;
        }
        return {(float)V, mean, m2, s};
    }
    __device__ static Welford combine(Welford a, Welford b) {
        const float n = a.n + b.n;
        if (n == 0.0f) {
            return {0.0f, 0.0f, 0.0f, 0.0f};
        }
        const float d = b.mean - a.mean;
        const float r = b.n / n;
        return {n, a.mean + d * r, a.m2 + b.m2 + d * d * a.n * r, a.s + b.s};
    }
    __device__ Welford shfl(int src, bool xr) const {
        return xr ? Welford{__shfl_xor_sync(FULL_MASK, n, src), __shfl_xor_sync(FULL_MASK, mean, src),
                            __shfl_xor_sync(FULL_MASK, m2, src), __shfl_xor_sync(FULL_MASK, s, src)}
                  : Welford{__shfl_sync(FULL_MASK, n, src), __shfl_sync(FULL_MASK, mean, src),
                            __shfl_sync(FULL_MASK, m2, src), __shfl_sync(FULL_MASK, s, src)};
    }
};

// Reduce over the GROUP consecutive threads (a power of two, or a multiple of 32) that share a row.
// Every thread of the block must call it (it shuffles with a full mask and may __syncthreads);
// red holds one state per warp of the block and is free again on return.
template <int GROUP, typename S>
__device__ __forceinline__ S group_reduce(S v, S* red) {
    constexpr int W = GROUP < 32 ? GROUP : 32;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
        v = S::combine(v, v.shfl(o, true));
    }
    v = v.shfl(lane & ~(W - 1), false);
    if constexpr (GROUP > 32) {
        constexpr int WPG = GROUP / 32;
        const int warp = threadIdx.x >> 5;
        if (lane == 0) {
            red[warp] = v;
        }
        __syncthreads();
        const int first = warp / WPG * WPG;
        v = red[first];
#pragma unroll
        for (int k = 1; k < WPG; ++k) {
            v = S::combine(v, red[first + k]);
        }
        __syncthreads();
    }
    return v;
}
