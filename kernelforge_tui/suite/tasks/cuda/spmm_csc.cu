//@ Suite task spmm_csc's baseline (sparse.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#include "csc_slice.cuh"

// A block owns SLICE / k rows of c (k <= SLICE), all k columns of each.
extern "C" __global__ void spmm_csc_naive(const T* values, const int* row_idx, const int* col_ptr, const T* b, T* c,
                                          int nrows, int ncols, int k) {
    __shared__ float acc[SLICE];
    const int per_block = SLICE / k;
    const int r0 = blockIdx.x * per_block;
    const int rows = min(per_block, nrows - r0);
    for (int i = threadIdx.x; i < rows * k; i += blockDim.x) {
        acc[i] = 0.0f;
    }
    __syncthreads();
    for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
        for (int p = col_ptr[col]; p < col_ptr[col + 1]; ++p) {
            const int i = row_idx[p] - r0;
            if (i >= 0 && i < rows) {
                const float v = ld(values, p);
                for (int j = 0; j < k; ++j) {
                    atomicAdd(&acc[i * k + j], v * ld(b, (long long)col * k + j));
                }
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * k; i += blockDim.x) {
        c[(long long)r0 * k + i] = cv(acc[i]);
    }
}
