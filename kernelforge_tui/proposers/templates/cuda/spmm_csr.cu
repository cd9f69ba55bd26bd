//@ CSR SpMM: COLUMN_LANES lanes across a row of c (VEC columns each), SPLIT groups of them sharing out the row's
//@ entries, added up by xor shuffles.
#include "sparse_head.cuh"
#define COLUMN_LANES $column_lanes  // lanes across a row of c, VEC columns each
#define SPLIT $split  // groups of COLUMN_LANES lanes that share out a row's entries

extern "C" __global__ void __launch_bounds__($block, $minb) kf_spmm_csr(const T* __restrict__ values, const int* __restrict__ col_idx,
    const int* __restrict__ row_ptr, const T* __restrict__ b, T* __restrict__ c, int nrows) {
#include "sparse_row.cuh"
const int part = lane / COLUMN_LANES;
const int chunk = lane % COLUMN_LANES;
float acc[VEC];
#pragma unroll
for (int j = 0; j < VEC; ++j) {
    acc[j] = 0.0f;
}
if (r < nrows) {
    const int end = row_ptr[r + 1];
#pragma unroll $unroll
    for (int p = row_ptr[r] + part; p < end; p += SPLIT) {
        const float v = to_f(values[p]);
        float f[VEC];
        load_chunk(b, (long long)col_idx[p] * COLUMN_LANES + chunk, f);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            acc[j] += v * f[j];
        }
    }
}
// Every lane of the warp gets here; xor over the part bits adds the SPLIT groups' partial rows.
#pragma unroll
for (int o = LANES / 2; o >= COLUMN_LANES; o >>= 1) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        acc[j] += __shfl_xor_sync(FULL_MASK, acc[j], o);
    }
}
if (part == 0 && r < nrows) {
    store_chunk(c, (long long)r * COLUMN_LANES + chunk, acc);
}
}
