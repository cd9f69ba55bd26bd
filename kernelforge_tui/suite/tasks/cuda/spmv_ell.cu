//@ Suite task spmv_ell's baseline (sparse.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per row over all its width slots, skipping padding (column -1: x is never read there).
extern "C" __global__ void spmv_ell_naive(const T* values, const int* col_idx, const T* x, T* y, int nrows, int width) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < nrows) {
        float sum = 0.0f;
        for (int s = 0; s < width; ++s) {
            const long long at = (long long)r * width + s;
            const int col = col_idx[at];
            if (col >= 0) {
                sum += ld(values, at) * ld(x, col);
            }
        }
        y[r] = cv(sum);
    }
}
