//@ Suite task spmm_csr's baseline (sparse.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output c[r, j]: the fp32 sum over row r's entries of value * b[col, j]. Neighbouring threads share
// a row and read neighbouring b elements.
extern "C" __global__ void spmm_csr_naive(const T* values, const int* col_idx, const int* row_ptr, const T* b, T* c,
                                          int nrows, int k) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)nrows * k) {
        const int r = (int)(i / k);
        const int j = (int)(i % k);
        float sum = 0.0f;
        for (int p = row_ptr[r]; p < row_ptr[r + 1]; ++p) {
            sum += ld(values, p) * ld(b, (long long)col_idx[p] * k + j);
        }
        c[i] = cv(sum);
    }
}
