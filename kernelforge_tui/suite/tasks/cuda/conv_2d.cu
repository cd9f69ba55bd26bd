//@ Suite task conv_2d's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output y[b, o, r, q] = sum over c, dy, dx of weight[o, c, dy, dx] * x[b, c, r + dy - k/2,
// q + dx - k/2] (torch's conv2d: a cross-correlation, zero padding, same size), fp32 sums, global loads.
extern "C" __global__ void conv_2d_naive(const T* x, const T* weight, T* y, int n, int ci, int co, int h, int w,
                                         int k) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * co * h * w) {
        return;
    }
    const int q = (int)(idx % w);
    const int r = (int)(idx / w % h);
    const int o = (int)(idx / ((long long)w * h) % co);
    const long long b = idx / ((long long)w * h * co);
    float acc = 0.0f;
    for (int c = 0; c < ci; ++c) {
        for (int dy = 0; dy < k; ++dy) {
            for (int dx = 0; dx < k; ++dx) {
                const int row = r + dy - k / 2;
                const int col = q + dx - k / 2;
                if (row >= 0 && row < h && col >= 0 && col < w) {
                    const float wv = ld(weight, (((long long)o * ci + c) * k + dy) * k + dx);
                    acc += wv * ld(x, ((b * ci + c) * h + row) * w + col);
                }
            }
        }
    }
    y[idx] = cv(acc);
}
