//@ What every baseline starts with, the captured cards' and the suite's: the element type T, BLOCK, ld (to fp32) and
//@ cv (from fp32) for one dtype, under a comment saying what the kernel is.
// $what ($dtype in and out, fp32 math): the baseline $author writes, plainly correct
// for any size, not tuned. Every speedup of a search on this card is measured against it.
//@if is_bf16
#include <cuda_bf16.h>
typedef __nv_bfloat16 T;
//@end
//@if is_f16
#include <cuda_fp16.h>
typedef __half T;
//@end
//@if is_f32
typedef float T;
//@end
#define BLOCK $block
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float ld(const T* p, long long i) {
    const T v = p[i];
//@if is_bf16
    return __bfloat162float(v);
//@end
//@if is_f16
    return __half2float(v);
//@end
//@if is_f32
    return v;
//@end
}

//@if is_bf16
__device__ __forceinline__ T cv(float v) { return __float2bfloat16_rn(v); }
//@end
//@if is_f16
__device__ __forceinline__ T cv(float v) { return __float2half_rn(v); }
//@end
//@if is_f32
__device__ __forceinline__ T cv(float v) { return v; }
//@end
