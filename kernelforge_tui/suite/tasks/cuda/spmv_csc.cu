//@ Suite task spmv_csc's baseline (sparse.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#include "csc_slice.cuh"

extern "C" __global__ void spmv_csc_naive(const T* values, const int* row_idx, const int* col_ptr, const T* x, T* y,
                                          int nrows, int ncols) {
    __shared__ float acc[SLICE];
    const int r0 = blockIdx.x * SLICE;
    const int rows = min(SLICE, nrows - r0);
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        acc[i] = 0.0f;
    }
    __syncthreads();
    for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
        const float xc = ld(x, col);
        for (int p = col_ptr[col]; p < col_ptr[col + 1]; ++p) {
            const int i = row_idx[p] - r0;
            if (i >= 0 && i < rows) {
                atomicAdd(&acc[i], ld(values, p) * xc);
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        y[r0 + i] = cv(acc[i]);
    }
}
