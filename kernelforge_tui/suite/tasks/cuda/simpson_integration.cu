//@ Suite task simpson_integration's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per integral: walks its row of m + 1 samples with the weights 1, 4, 2, ..., 4, 1 (fp32 sum), then
// times h / 3 with h = 1 / m (m even).
extern "C" __global__ void simpson_integration_naive(const T* f, T* integral, int rows, int m) {
    const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const long long row = r * (m + 1);
    float s = ld(f, row) + ld(f, row + m);
    for (int i = 1; i < m; ++i) {
        s += (i % 2 == 1 ? 4.0f : 2.0f) * ld(f, row + i);
    }
    integral[r] = cv(s / (3.0f * (float)m));
}
