//@ Suite task spmm_ell's baseline (sparse.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output c[r, j] over row r's width slots, skipping padding (column -1: b is never read there).
extern "C" __global__ void spmm_ell_naive(const T* values, const int* col_idx, const T* b, T* c, int nrows, int width,
                                          int k) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)nrows * k) {
        const int r = (int)(i / k);
        const int j = (int)(i % k);
        float sum = 0.0f;
        for (int s = 0; s < width; ++s) {
            const long long at = (long long)r * width + s;
            const int col = col_idx[at];
            if (col >= 0) {
                sum += ld(values, at) * ld(b, (long long)col * k + j);
            }
        }
        c[i] = cv(sum);
    }
}
