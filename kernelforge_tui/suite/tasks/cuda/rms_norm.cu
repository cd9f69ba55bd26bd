//@ Suite task rms_norm's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per row: the sum of squares, then the write. eps 1e-6. An inf makes the sum inf and the scale 0, so the
// row is 0 with NaN at the inf (inf * 0), as torch gives.
extern "C" __global__ void rms_norm_naive(const T* x, const T* w, T* y, int rows, int cols) {
    const int r = blockIdx.x * BLOCK + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const long long base = (long long)r * cols;
    float ss = 0.0f;
    for (int j = 0; j < cols; ++j) {
        const float v = ld(x, base + j);
        ss += v * v;
    }
    const float scale = rsqrtf(ss / (float)cols + 1e-6f);
    for (int j = 0; j < cols; ++j) {
        y[base + j] = cv(ld(x, base + j) * scale * ld(w, j));
    }
}
