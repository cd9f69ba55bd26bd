//@ A row of softmax logits made from x on the fly: ld(row, j) is x[j] scaled ($scale_op $scale, eager's scalar as a
//@ float) where `scaled`, plus the mask row's m[j] where `masked`, in fp32, so that the softmax's loops read them as
//@ a plain row (ld(xr, j)) and nothing writes them out. A mask row is shared by the rows it broadcasts over. With
//@ `rounded`, each of the two results as eager stores it, in T.
//@if rounded
#include "rounded.cuh"
#define STORED(v) rd(v)
//@else
#define STORED(v) (v)
//@end
struct LogitsRow {
    const T* x;
    const T* m;
};

__device__ __forceinline__ float ld(const LogitsRow& row, long long j) {
    float v = ld(row.x, j);
//@if scaled
    v = STORED(v $scale_op $scale);
//@end
//@if masked
    v = STORED(v + ld(row.m, j));
//@end
    return v;
}
