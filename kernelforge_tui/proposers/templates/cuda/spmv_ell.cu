//@ ELL SpMV: a lane group per row over its WIDTH slots; stop ends a lane at its first padding slot (padding
//@ only trails a row and a lane's slots ascend: its later slots are padding), skip tests every one.
#include "sparse_head.cuh"
#define WIDTH $width

extern "C" __global__ void __launch_bounds__($block, $minb) kf_spmv_ell(const T* __restrict__ values, const int* __restrict__ col_idx,
    const T* __restrict__ x, T* __restrict__ y, int nrows) {
#include "sparse_row.cuh"
float sum = 0.0f;
if (r < nrows) {
    const long long base = (long long)r * WIDTH;
#pragma unroll $unroll
    for (int s = lane; s < WIDTH; s += LANES) {
        const int col = col_idx[base + s];
//@if stop
        if (col < 0) {
            break;
        }
        sum += to_f(values[base + s]) * to_f(x[col]);
//@else
        if (col >= 0) {
            sum += to_f(values[base + s]) * to_f(x[col]);
        }
//@end
    }
}
#include "sparse_row_reduce.cuh"
