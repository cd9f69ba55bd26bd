//@ CSR SpMV, stream: the block owns RPB rows and streams their entries in tiles; paired: stream with the row
//@ blocks of each pair b, blocks - 1 - b swapped when the later one has more entries.
#include "sparse_head.cuh"
#include "spmv_csr_loads.cuh"
#include "spmv_csr_stream_helpers.cuh"

#include "spmv_csr_signature.cuh"
#include "spmv_csr_block_rows.cuh"
//@if paired
    // Blocks b and blocks - 1 - b swap row blocks when the later one's has more entries: the earlier block
    // streams the heavier of the two, so the launch's heavy row blocks start in its first half.
    __shared__ int row_block;
    if (threadIdx.x == 0) {
        const int early = min((int)blockIdx.x, (int)gridDim.x - 1 - (int)blockIdx.x);
        const int late = (int)gridDim.x - 1 - early;
        const int early_entries = row_ptr[min((early + 1) * RPB, nrows)] - row_ptr[early * RPB];
        const int late_entries = row_ptr[min((late + 1) * RPB, nrows)] - row_ptr[late * RPB];
        row_block = late_entries > early_entries ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    }
    __syncthreads();
    const int r0 = row_block * RPB;
//@else
    const int r0 = blockIdx.x * RPB;
//@end
    const int n = min(RPB, nrows - r0);
#include "spmv_csr_rows_in.cuh"
    const int first = rp[0];
    const int last = rp[n];
#include "spmv_csr_tile_loop.cuh"
    for (int i = threadIdx.x; i < n; i += BLOCK) {
        y[r0 + i] = from_f(acc[i]);
    }
}
