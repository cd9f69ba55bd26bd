//@ Suite task sorting's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// Rank sort: a thread per key counts the keys that sort before it and writes its key at that rank. The order is
// strict and total, so the ranks are a permutation and every slot is written once: numbers ascending (+0 and -0
// equal), NaN after every number, equal keys (and NaNs) by index. O(n^2) comparisons: the task's scales stop at
// 2^18 (~20 ms on an H200).
__device__ __forceinline__ bool sorts_before(float a, int j, float b, int i) {
    const bool a_nan = a != a;
    const bool b_nan = b != b;
    if (a_nan || b_nan) {
        return a_nan ? b_nan && j < i : true;
    }
    return a < b || (a == b && j < i);
}

extern "C" __global__ void sorting_naive(const T* x, T* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const float key = ld(x, i);
    int rank = 0;
    for (int j = 0; j < n; ++j) {
        rank += sorts_before(ld(x, j), j, key, i);
    }
    y[rank] = x[i];
}
