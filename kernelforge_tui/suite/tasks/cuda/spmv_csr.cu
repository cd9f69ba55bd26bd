//@ Suite task spmv_csr's baseline (sparse.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per row: y[r] is the fp32 sum over the row's entries. A long row keeps its thread, and the 31 others of
// its warp, busy alone: the imbalance power-law rows cause.
extern "C" __global__ void spmv_csr_naive(const T* values, const int* col_idx, const int* row_ptr, const T* x, T* y,
                                          int nrows) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < nrows) {
        float sum = 0.0f;
        for (int p = row_ptr[r]; p < row_ptr[r + 1]; ++p) {
            sum += ld(values, p) * ld(x, col_idx[p]);
        }
        y[r] = cv(sum);
    }
}
