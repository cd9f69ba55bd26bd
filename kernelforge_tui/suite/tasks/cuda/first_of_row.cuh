//@ The COO baselines' search. COO sorted by row: a row's entries are one run of row_idx, found by binary search; no
//@ atomics, every output written once (an empty row's search lands on the next row and sums nothing).
// The first position p with row_idx[p] >= r (nnz when none): row_idx is sorted.
__device__ int first_of_row(const int* row_idx, int nnz, int r) {
    int lo = 0;
    int hi = nnz;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (row_idx[mid] < r) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}
