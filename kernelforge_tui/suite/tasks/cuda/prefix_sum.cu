//@ Suite task prefix_sum's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// Inclusive scan in one launch, as a student writes it when blocks cannot wait for each other (a chained or
// look-back scan needs flags in zeroed memory, and a card's only memory is its tensors). Block b owns the CHUNK
// elements from b * CHUNK and:
//  1. re-reads every element before its chunk to get its carry (each thread a strided share, then a tree in
//     shared memory): O(n^2 / CHUNK) reads in all, the naive part;
//  2. each thread sums its ITEMS consecutive elements serially;
//  3. the block scans the thread totals (Hillis-Steele in shared memory);
//  4. each thread adds its elements one by one onto carry + the totals before it, and writes each running sum.
// At n = 2^22: 2048 blocks, 4.3e9 element reads in step 1 (17 GB in fp32, from L2 mostly: x is 16 MB), a few ms
// on an H200 (the 100 ms a naive kernel may take is far off).
#define ITEMS 8
#define CHUNK (BLOCK * ITEMS)

extern "C" __global__ void prefix_sum_naive(const T* x, T* y, int n) {
    __shared__ float sh[BLOCK];
    const int t = threadIdx.x;
    const long long start = (long long)blockIdx.x * CHUNK;
    float part = 0.0f;
    for (long long i = t; i < start; i += BLOCK) {
        part += ld(x, i);
    }
    sh[t] = part;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (t < s) {
            sh[t] += sh[t + s];
        }
        __syncthreads();
    }
    const float carry = sh[0];
    __syncthreads();

    const long long first = start + (long long)t * ITEMS;
    float own = 0.0f;
    for (int j = 0; j < ITEMS; ++j) {
        if (first + j < n) {
            own += ld(x, first + j);
        }
    }
    sh[t] = own;
    __syncthreads();
    for (int d = 1; d < BLOCK; d <<= 1) {
        const float add = t >= d ? sh[t - d] : 0.0f;
        __syncthreads();
        sh[t] += add;
        __syncthreads();
    }
    float run = carry + (t > 0 ? sh[t - 1] : 0.0f);
    for (int j = 0; j < ITEMS; ++j) {
        if (first + j < n) {
            run += ld(x, first + j);
            y[first + j] = cv(run);
        }
    }
}
