//@ Suite task spmm_coo's baseline (sparse.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#include "first_of_row.cuh"

// A thread per output c[r, j]: binary search for row r's run, then the fp32 sum of value * b[col, j] over it.
extern "C" __global__ void spmm_coo_naive(const T* values, const int* row_idx, const int* col_idx, const T* b, T* c,
                                          int nrows, int k, int nnz) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)nrows * k) {
        const int r = (int)(i / k);
        const int j = (int)(i % k);
        float sum = 0.0f;
        for (int p = first_of_row(row_idx, nnz, r); p < nnz && row_idx[p] == r; ++p) {
            sum += ld(values, p) * ld(b, (long long)col_idx[p] * k + j);
        }
        c[i] = cv(sum);
    }
}
