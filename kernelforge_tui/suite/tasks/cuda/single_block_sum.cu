//@ A full reduction's baseline (activations.py): one block of THREADS threads, strided fp32 partial sums of $term
//@ (over x and y, the two inputs' values at i), a shared-memory tree, and thread 0 writing the sum (or the mean);
//@ after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#define THREADS $threads

extern "C" __global__ void ${name}_naive(const T* $first, const T* $second, T* $out, int n) {
    // One block: each thread sums every THREADS-th term in fp32, then a shared-memory tree halves the partial
    // sums. Thread 0 writes the result; nothing accumulates into $out (it is poisoned before each launch).
    __shared__ float partial[THREADS];
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += THREADS) {
        const float x = ld($first, i);
        const float y = ld($second, i);
        sum += $term;
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            partial[threadIdx.x] += partial[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
//@if mean
        $out[0] = cv(partial[0] / (float)n);
//@else
        $out[0] = cv(partial[0]);
//@end
    }
}
