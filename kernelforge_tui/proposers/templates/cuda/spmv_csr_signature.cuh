//@ CSR SpMV's entry point. Every kernel bounds its block (without it ptxas may use more registers than the launch
//@ allows); a cluster's size goes before __global__ (the source check's CUDA grammar misreads it after the return
//@ type), and a plain launch honours it up to the portable 8 blocks.
//@if clustered
extern "C" __cluster_dims__($cluster, 1, 1) __global__ void __launch_bounds__($block, $minb) kf_spmv_csr(const T* __restrict__ values, const int* __restrict__ col_idx,
//@else
extern "C" __global__ void __launch_bounds__($block, $minb) kf_spmv_csr(const T* __restrict__ values, const int* __restrict__ col_idx,
//@end
    const int* __restrict__ row_ptr, const T* __restrict__ x, T* __restrict__ y, int nrows) {
