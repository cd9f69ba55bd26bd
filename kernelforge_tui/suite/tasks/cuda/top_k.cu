//@ Suite task top_k's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#define MAX_K 32  // the task's k is 8

// A thread per row, one pass: the k best so far kept sorted (descending) in a local array; an element enters only
// if strictly greater than the k-th best and moves up past strictly smaller ones, so among equal values the
// earlier (lower) index stays ahead: ties go to the lower index.
extern "C" __global__ void top_k_naive(const T* x, T* values, int* indices, int rows, int cols, int k) {
    const int r = blockIdx.x * BLOCK + threadIdx.x;
    if (r >= rows || k > MAX_K) {
        return;
    }
    const long long base = (long long)r * cols;
    float best[MAX_K];
    int where[MAX_K];
    int count = 0;
    for (int j = 0; j < cols; ++j) {
        const float v = ld(x, base + j);
        if (count == k && !(v > best[k - 1])) {
            continue;
        }
        int p = count < k ? count++ : k - 1;
        while (p > 0 && best[p - 1] < v) {
            best[p] = best[p - 1];
            where[p] = where[p - 1];
            --p;
        }
        best[p] = v;
        where[p] = j;
    }
    for (int p = 0; p < k; ++p) {
        values[(long long)r * k + p] = x[base + where[p]];
        indices[(long long)r * k + p] = where[p];
    }
}
