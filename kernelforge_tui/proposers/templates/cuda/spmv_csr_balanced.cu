//@ CSR SpMV, balanced: a thread block cluster's entries shared evenly by its blocks, rows assembled through
//@ distributed shared memory.
#include "sparse_head.cuh"
#include "spmv_csr_loads.cuh"
#define CLUSTER $cluster  // blocks a cluster: they share its rows' entries evenly
#define ROWS (CLUSTER * RPB)  // the cluster's rows
#include "spmv_csr_stream_helpers.cuh"

#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// The first of the row pointers rp[0..n] at or past entry p (n when only rp[n] is).
__device__ __forceinline__ int first_at(const int* rp, int n, int p) {
    int lo = 0;
    int hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (rp[mid] < p) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Where block k of a cluster starts in the cluster's w entries from e0 (block k streams [bound(k), bound(k + 1)),
// bound(CLUSTER) = e0 + w); 64-bit, as w * k may pass 2^31.
__device__ __forceinline__ int bound(int e0, int w, int k) {
    return e0 + (int)((long long)w * k / CLUSTER);
}

#include "spmv_csr_signature.cuh"
    __shared__ int rp[ROWS + 1];  // the cluster's row pointers (a block's range may span any of its rows)
    __shared__ float acc[ROWS];  // their sums over this block's range of entries
#include "spmv_csr_products.cuh"
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int r0 = blockIdx.x / CLUSTER * ROWS;
    const int n = min(ROWS, nrows - r0);
#include "spmv_csr_rows_in.cuh"
    // This block's share of the cluster's entries: as many in every block (to one), whatever the rows.
    const int first = bound(rp[0], rp[n] - rp[0], rank);
    const int last = bound(rp[0], rp[n] - rp[0], rank + 1);
#include "spmv_csr_tile_loop.cuh"
    // The rows this block writes: those starting in its range [first, last), in the last block also those
    // starting at the cluster's end (trailing empty rows); so every row of the cluster exactly once.
    const int mine = first_at(rp, n, first);
    const int past = rank == CLUSTER - 1 ? n : first_at(rp, n, last);
    const int e0 = rp[0];  // read again, not kept in registers through the loop
    const int w = rp[n] - e0;
    cluster.sync();  // every block's acc complete
    for (int i = mine + threadIdx.x; i < past; i += BLOCK) {
        float s = acc[i];
        const int end = rp[i + 1];
        // A row going on past this block's range is the first row of each later block whose range starts inside
        // it: add their sums of it (0 from a block with an empty range: its acc stays zeroed).
        for (int k = rank + 1; k < CLUSTER && bound(e0, w, k) < end; ++k) {
            s += *cluster.map_shared_rank(&acc[i], k);
        }
        y[r0 + i] = from_f(s);
    }
    cluster.sync();  // no block may release its shared memory while another still reads it
}
