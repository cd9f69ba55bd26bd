//@ CSR SpMV, adopt: stream, with the launch's later half handing its long rows to its mirror blocks of the
//@ earlier half, which sum them first.
#include "sparse_head.cuh"
#include "spmv_csr_loads.cuh"
#define LONG $long  // a row of more entries is long
#define CAP $cap  // a late block's long rows handed over at most (it sums any others itself)
#include "spmv_csr_stream_helpers.cuh"

// The threads for which `pick` holds, the first CAP of them in order, into list; how many (in every thread).
// counts: BLOCK / 32 ints, free again on return.
__device__ __forceinline__ int compact(bool pick, int* list, int* counts) {
    const unsigned picks = __ballot_sync(FULL_MASK, pick);
    if ((threadIdx.x & 31) == 0) {
        counts[threadIdx.x >> 5] = __popc(picks);
    }
    __syncthreads();
    int before = 0;
    int total = 0;
    for (int w = 0; w < BLOCK / 32; ++w) {
        before += w < (int)(threadIdx.x >> 5) ? counts[w] : 0;
        total += counts[w];
    }
    const int slot = before + __popc(picks & ((1u << (threadIdx.x & 31)) - 1u));
    if (pick && slot < CAP) {
        list[slot] = (int)threadIdx.x;
    }
    __syncthreads();
    return min(total, CAP);
}

#include "spmv_csr_signature.cuh"
#include "spmv_csr_block_rows.cuh"
    __shared__ int handed[CAP];  // a late block's long rows, summed by its adopter
    __shared__ int adopted[CAP];  // an adopter's: its late block's handed rows
    __shared__ int counts[BLOCK / 32];
    __shared__ int adopted_rp[CAP][2];  // the adopted rows' first and last entries
    __shared__ float adopted_acc[CAP];  // and their sums
    // The launch's later half is late: block b's long rows go to block blocks - 1 - b, of the earlier half, which
    // sums them first (the launch's long rows so all start in its first half; its last blocks are light).
    const int blocks = (int)gridDim.x;
    const bool late = (int)blockIdx.x >= blocks - blocks / 2;
    const int r0 = blockIdx.x * RPB;
    const int n = min(RPB, nrows - r0);
    const int ra = (blocks - 1 - (int)blockIdx.x) * RPB;  // an adopter's late block's first row
    const int na = (int)blockIdx.x < blocks / 2 ? min(RPB, nrows - ra) : 0;
    // The late block's row threadIdx.x is long (its pointers loaded with the block's own)? The late block tests its
    // own rows the same way (below): the two must agree on every row.
    bool pick = false;
    if ((int)threadIdx.x < na) {
        pick = row_ptr[ra + threadIdx.x + 1] - row_ptr[ra + threadIdx.x] > LONG;
    }
#include "spmv_csr_rows_in.cuh"
    const int adopted_count = compact(pick, adopted, counts);
    const int handed_count = compact(late && (int)threadIdx.x < n && rp[threadIdx.x + 1] - rp[threadIdx.x] > LONG,
                                     handed, counts);
    if ((int)threadIdx.x < adopted_count) {
        const int row = ra + adopted[threadIdx.x];
        adopted_rp[threadIdx.x][0] = row_ptr[row];
        adopted_rp[threadIdx.x][1] = row_ptr[row + 1];
        adopted_acc[threadIdx.x] = 0.0f;
    }
    __syncthreads();
    // The jobs in one loop (one copy of its code): each adopted row, then the runs of the block's rows between the
    // rows it hands over, each streamed as stream streams a block's rows.
    for (int job = 0; job <= adopted_count + handed_count; ++job) {
        const bool own = job >= adopted_count;
        const int run = job - adopted_count;
        const int first = !own ? adopted_rp[job][0] : run == 0 ? rp[0] : rp[handed[run - 1] + 1];
        const int last = !own ? adopted_rp[job][1] : run == handed_count ? rp[n] : rp[handed[run]];
        if (first < last) {  // the same in every thread
            const int* job_rp = own ? rp : adopted_rp[job];
            const int job_rows = own ? n : 1;
            float* job_acc = own ? acc : &adopted_acc[job];
            {
                // The job's rows (these names shadow the block's own).
                const int* rp = job_rp;
                const int n = job_rows;
                float* acc = job_acc;
            #include "spmv_csr_tile_loop.cuh"
            }
        }
    }
    if ((int)threadIdx.x < adopted_count) {
        y[ra + adopted[threadIdx.x]] = from_f(adopted_acc[threadIdx.x]);
    }
    for (int i = threadIdx.x; i < n; i += BLOCK) {
        bool kept = true;  // not handed over
        for (int k = 0; k < handed_count; ++k) {
            kept = kept && handed[k] != i;
        }
        if (kept) {
            y[r0 + i] = from_f(acc[i]);
        }
    }
}
