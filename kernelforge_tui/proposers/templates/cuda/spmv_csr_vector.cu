//@ CSR SpMV, vector: a lane group per row, VEC consecutive entries a load from the multiple of VEC at or
//@ before the row's start.
#include "sparse_head.cuh"
#include "spmv_csr_loads.cuh"

#include "spmv_csr_signature.cuh"
#include "sparse_row.cuh"
float sum = 0.0f;
if (r < nrows) {
    const int start = row_ptr[r];
    const int end = row_ptr[r + 1];
    // Chunks from the multiple of VEC at or before the row's start: the neighbours' entries they hold are read,
    // never added.
#pragma unroll $unroll
    for (int q = (start & ~(VEC - 1)) + lane * VEC; q < end; q += LANES * VEC) {
        Pack<T> v;
        Pack<int> c;
        v.load(values, q);
        c.load(col_idx, q);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            if (q + j >= start && q + j < end) {
                sum += to_f(v.e[j]) * to_f(GATHER(x + c.e[j]));
            }
        }
    }
}
#include "sparse_row_reduce.cuh"
