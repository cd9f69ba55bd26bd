//@ Headers, the element type T, fp32 conversions, and a 16-byte-or-less aligned vector of VEC elements.
//@ Base pointers are cudaMalloc'd (256-byte aligned; the worker's guard regions are 64 KiB), so chunk i of a tensor
//@ whose chunks start at multiples of VEC elements is aligned for one vector access.
//@if is_bf16
#include <cuda_bf16.h>
//@end
//@if is_f16
#include <cuda_fp16.h>
//@end
#include <stdint.h>

typedef $c_type T;
#define VEC $vec
#define NEG_INF __int_as_float(0xff800000)

struct __align__($vec_bytes) VecT {
    T v[VEC];
};

__device__ __forceinline__ float to_f(T v) { return $to_f; }
__device__ __forceinline__ T from_f(float v) { return $from_f; }

__device__ __forceinline__ void widen(const VecT c, float (&f)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        f[j] = to_f(c.v[j]);
    }
}

// Chunk i (VEC elements) of p, widened to fp32: one vector load (widen takes the chunk by value: widening it in
// place through a reference read each element on its own, 8 ld.global.u16 a bf16 chunk, 8x the L1 requests).
__device__ __forceinline__ void load_chunk(const T* __restrict__ p, long long i, float (&f)[VEC]) {
    widen(reinterpret_cast<const VecT*>(p)[i], f);
}

__device__ __forceinline__ void store_chunk(T* __restrict__ p, long long i, const float (&f)[VEC]) {
    VecT c;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        c.v[j] = from_f(f[j]);
    }
    reinterpret_cast<VecT*>(p)[i] = c;
}
