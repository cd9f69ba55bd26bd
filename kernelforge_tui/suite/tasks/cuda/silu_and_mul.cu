//@ Suite task silu_and_mul's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output element (t, j): the gate x[t, j] and the value x[t, hidden + j] of the same row.
extern "C" __global__ void silu_and_mul_naive(const T* x, T* y, long long n, int hidden) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) {
        const long long row = (i / hidden) * 2 * hidden;
        const int j = (int)(i % hidden);
        const float a = ld(x, row + j);
        y[i] = cv(a / (1.0f + expf(-a)) * ld(x, row + hidden + j));
    }
}
