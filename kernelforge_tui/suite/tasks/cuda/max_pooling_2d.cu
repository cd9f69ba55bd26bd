//@ Suite task max_pooling_2d's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output: the max of its 2x2 window. NaN propagates as in torch (fmaxf would drop it): a NaN value
// replaces the running max, and nothing replaces a NaN max (v > NaN is false). The max is one of the inputs, so
// cv() is exact.
extern "C" __global__ void max_pooling_2d_naive(const T* x, T* y, int n, int c, int h, int w) {
    const int ho = h / 2;
    const int wo = w / 2;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * c * ho * wo) {
        return;
    }
    const int q = (int)(idx % wo);
    const int r = (int)(idx / wo % ho);
    const long long plane = idx / ((long long)wo * ho);
    const T* p = x + (plane * h + 2 * r) * w + 2 * q;
    float m = ld(p, 0);
    const float others[3] = {ld(p, 1), ld(p, w), ld(p, w + 1)};
    for (int j = 0; j < 3; ++j) {
        if (others[j] > m || others[j] != others[j]) {
            m = others[j];
        }
    }
    y[idx] = cv(m);
}
