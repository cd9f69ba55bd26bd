//@ Suite task layer_norm's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per row, two passes for the statistics (the mean, then the centred sum of squares: no cancellation,
// and a constant row gives x - mean = 0 exactly, so y = b), then the write. eps 1e-5.
extern "C" __global__ void layer_norm_naive(const T* x, const T* w, const T* b, T* y, int rows, int cols) {
    const int r = blockIdx.x * BLOCK + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const long long base = (long long)r * cols;
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) {
        s += ld(x, base + j);
    }
    const float mean = s / (float)cols;
    float sq = 0.0f;
    for (int j = 0; j < cols; ++j) {
        const float d = ld(x, base + j) - mean;
        sq += d * d;
    }
    const float rstd = rsqrtf(sq / (float)cols + 1e-5f);
    for (int j = 0; j < cols; ++j) {
        y[base + j] = cv((ld(x, base + j) - mean) * rstd * ld(w, j) + ld(b, j));
    }
}
