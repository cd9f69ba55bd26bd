//@ Suite task conv_1d's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output y[b, o, i] = sum over c, t of weight[o, c, t] * x[b, c, i + t - k / 2] (torch's conv1d: a
// cross-correlation, zero padding, same length), fp32 sums, loads straight from global memory.
extern "C" __global__ void conv_1d_naive(const T* x, const T* weight, T* y, int n, int ci, int co, int l, int k) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * co * l) {
        return;
    }
    const int i = (int)(idx % l);
    const int o = (int)(idx / l % co);
    const long long b = idx / ((long long)l * co);
    float acc = 0.0f;
    for (int c = 0; c < ci; ++c) {
        for (int t = 0; t < k; ++t) {
            const int at = i + t - k / 2;
            if (at >= 0 && at < l) {
                acc += ld(weight, ((long long)o * ci + c) * k + t) * ld(x, (b * ci + c) * l + at);
            }
        }
    }
    y[idx] = cv(acc);
}
