//@ Suite task rope's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per output element. Rotate-half pairs (c, c + d/2) of each (token, head): with cs, sn the token's
// table entries for pair p, y[p] = x[p] cs - x[p + d/2] sn and y[p + d/2] = x[p + d/2] cs + x[p] sn.
extern "C" __global__ void rope_naive(const T* x, const T* cos_cache, const T* sin_cache, T* y, long long total,
                                      int heads, int d) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= total) {
        return;
    }
    const int half = d / 2;
    const int c = (int)(i % d);
    const long long token = i / ((long long)heads * d);
    const int p = c < half ? c : c - half;
    const long long pair = i - c + p;  // x[p] of this (token, head)
    const float cs = ld(cos_cache, token * half + p);
    const float sn = ld(sin_cache, token * half + p);
    const float first = ld(x, pair), second = ld(x, pair + half);
    y[i] = cv(c < half ? first * cs - second * sn : second * cs + first * sn);
}
