//@ matrix_copy's and matrix_transpose's baseline (dense.py); after the suite's prelude (T, ld, cv, BLOCK:
//@ capture/cuda/prelude.cuh).

// A thread per element of A on a 16x16 grid of blocks; the value moves as T, never through fp32.
extern "C" __global__ void $entry(const T* A, T* B, int rows, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) {
//@if transpose
        B[(long long)c * rows + r] = A[(long long)r * cols + c];
//@else
        B[(long long)r * cols + c] = A[(long long)r * cols + c];
//@end
    }
}
