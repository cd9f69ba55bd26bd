//@ A block's rows in shared memory (stream's, paired's, adopt's): their pointers and sums, and a tile's products.
    __shared__ int rp[RPB + 1];  // the block's row pointers
    __shared__ float acc[RPB];  // its rows' sums
#include "spmv_csr_products.cuh"
