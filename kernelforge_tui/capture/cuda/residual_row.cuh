//@ A row that is the sum of two tensors' rows: ld(row, j) reads x[j] + r[j] in fp32, so that a norm's loops read
//@ the residual sum as they read a plain row (ld(xr, j)), and nothing writes the sum out; with `rounded`, the sum as
//@ eager stores it, in T.
//@if rounded
#include "rounded.cuh"
//@end
struct SumRow {
    const T* x;
    const T* r;
};

//@if rounded
__device__ __forceinline__ float ld(const SumRow& row, long long j) { return rd(ld(row.x, j) + ld(row.r, j)); }
//@else
__device__ __forceinline__ float ld(const SumRow& row, long long j) { return ld(row.x, j) + ld(row.r, j); }
//@end
