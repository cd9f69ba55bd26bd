//@ Suite task vector_add's baseline (dense.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

extern "C" __global__ void vector_add_naive(const T* a, const T* b, T* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = cv(ld(a, i) + ld(b, i));
    }
}
