//@ Suite task matrix_scalar_mul's baseline (dense.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per element on a 16x16 grid of blocks; every thread reads the scalar.
extern "C" __global__ void matrix_scalar_mul_naive(const T* A, const T* s, T* B, int side) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < side && c < side) {
        const long long i = (long long)r * side + c;
        B[i] = cv(ld(A, i) * ld(s, 0));
    }
}
