//@ Suite task spmv_coo's baseline (sparse.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#include "first_of_row.cuh"

// A thread per row: binary search for the row's run, then the fp32 sum over it.
extern "C" __global__ void spmv_coo_naive(const T* values, const int* row_idx, const int* col_idx, const T* x, T* y,
                                          int nrows, int nnz) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < nrows) {
        float sum = 0.0f;
        for (int p = first_of_row(row_idx, nnz, r); p < nnz && row_idx[p] == r; ++p) {
            sum += ld(values, p) * ld(x, col_idx[p]);
        }
        y[r] = cv(sum);
    }
}
