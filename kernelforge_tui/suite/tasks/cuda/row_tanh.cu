//@ Suite task row_tanh's baseline (activations.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

extern "C" __global__ void row_tanh_naive(const T* x, T* y, int rows, int cols) {
    // A thread per element: blockIdx.y is the row, the x threads walk its columns; fp32 tanhf.
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y;
    if (row < rows && col < cols) {
        const long long i = (long long)row * cols + col;
        y[i] = cv(tanhf(ld(x, i)));
    }
}
