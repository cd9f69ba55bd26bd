//@ The tiled kernels' sizes, the search for an entry's row and the tile's loads.
#define BLOCK $block
#define ITEMS $items  // entries a thread loads, then sums, per tile
#define CHUNKS (ITEMS / VEC)
#define DIRECT (ITEMS == VEC)  // a thread sums the very entries it loads: products in registers, no barrier a tile
#define TILE (BLOCK * ITEMS)  // entries a block streams a step
#define SKEW(i) ((i) + ((i) >> 5))  // a pad word every 32: a thread's ITEMS consecutive products in distinct banks

// The block's row holding entry p (rp[0] <= p < rp[n]): the last of its n rows starting at or before p, never an
// empty one.
__device__ __forceinline__ int row_of(const int* rp, int n, int p) {
    int lo = 0;
    int hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (rp[mid] <= p) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// The tile from entry a (a multiple of VEC): chunk threadIdx.x + m * BLOCK (coalesced), those starting before last.
// Chunks never pass the arrays' end: last <= nnz, a multiple of VEC.
__device__ __forceinline__ void load_tile(const T* __restrict__ values, const int* __restrict__ col_idx, int a,
                                          int last, Pack<T> (&v)[CHUNKS], Pack<int> (&c)[CHUNKS]) {
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
        const int q = a + (threadIdx.x + m * BLOCK) * VEC;
        if (q < last) {
            v[m].load(values, q);
            c[m].load(col_idx, q);
        }
    }
}
