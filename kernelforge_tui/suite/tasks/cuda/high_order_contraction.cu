//@ Suite task high_order_contraction's baseline (dense.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per element of C, summing over d and then e in fp32; the flat index splits into (a, b, c).
extern "C" __global__ void high_order_contraction_naive(const T* A, const T* B, T* C, int na, int nb, int nc,
                                                         int nd, int ne) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)na * nb * nc) {
        const long long c = i % nc;
        const long long b = i / nc % nb;
        const long long a = i / ((long long)nc * nb);
        float acc = 0.0f;
        for (int d = 0; d < nd; ++d) {
            for (int e = 0; e < ne; ++e) {
                acc += ld(A, (a * nd + d) * ne + e) * ld(B, ((d * nb + b) * ne + e) * nc + c);
            }
        }
        C[i] = cv(acc);
    }
}
