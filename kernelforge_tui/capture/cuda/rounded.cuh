//@ v rounded to T and back: a fused chain's kernel keeps an intermediate result as eager PyTorch stores it, in the
//@ tensors' dtype, where the card's reference does (a chain card's `rounded`).
__device__ __forceinline__ float rd(float v) {
    const T t = cv(v);
    return ld(&t, 0);
}
