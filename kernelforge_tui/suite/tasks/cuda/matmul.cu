//@ Suite task matmul's baseline (dense.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per element of C on a 16x16 grid of blocks: a row of A and a column of B from global memory, fp32 sum.
extern "C" __global__ void matmul_naive(const T* A, const T* B, T* C, int M, int N, int K) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            acc += ld(A, (long long)row * K + k) * ld(B, (long long)k * N + col);
        }
        C[(long long)row * N + col] = cv(acc);
    }
}
