//@ Suite task softmax's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per row: the row's max, the sum of exp(x - max), then exp(x - max) / sum, three reads of the row.
// fmaxf skips a NaN but exp(NaN - max) does not, so a NaN, a +inf (inf - inf) or an all -inf row (-inf - -inf)
// makes its row NaN, as torch.softmax gives; a -inf alone is a masked entry (exp(-inf) = 0).
extern "C" __global__ void softmax_naive(const T* x, T* y, int rows, int cols) {
    const int r = blockIdx.x * BLOCK + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const long long base = (long long)r * cols;
    float m = NEG_INF;
    for (int j = 0; j < cols; ++j) {
        m = fmaxf(m, ld(x, base + j));
    }
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) {
        s += expf(ld(x, base + j) - m);
    }
    for (int j = 0; j < cols; ++j) {
        y[base + j] = cv(expf(ld(x, base + j) - m) / s);
    }
}
