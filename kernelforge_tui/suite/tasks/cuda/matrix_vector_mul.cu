//@ Suite task matrix_vector_mul's baseline (dense.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output row, walking its row of A (uncoalesced across the warp), fp32 sum.
extern "C" __global__ void matrix_vector_mul_naive(const T* A, const T* x, T* y, int M, int K) {
    const int m = blockIdx.x * blockDim.x + threadIdx.x;
    if (m < M) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            acc += ld(A, (long long)m * K + k) * ld(x, k);
        }
        y[m] = cv(acc);
    }
}
