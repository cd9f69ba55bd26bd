//@ Suite task reverse_array's baseline (dense.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output element; the value moves as T, never through fp32.
extern "C" __global__ void reverse_array_naive(const T* x, T* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = x[n - 1 - i];
    }
}
