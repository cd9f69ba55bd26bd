//@ Suite task fft's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A naive DFT, a thread per output bin (row r, frequency k): y[k] = sum over j of x[j] * exp(-2 pi i j k / m),
// fp32 sums. The angle is reduced exactly in integers, (j * k) mod m, before sincospif: an fp32 angle 2 pi j k / m
// loses its low bits once j * k is large. m complex products per output (1024), ~10 ms at 2^22 on an H200.
extern "C" __global__ void fft_naive(const T* x, T* y, int batch, int m) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)batch * m) {
        return;
    }
    const int k = (int)(idx % m);
    const long long row = (idx - k) * 2;
    float re = 0.0f;
    float im = 0.0f;
    for (int j = 0; j < m; ++j) {
        const int turn = (int)((long long)j * k % m);
        float s;
        float c;
        sincospif(-2.0f * (float)turn / (float)m, &s, &c);
        const float a = ld(x, row + 2 * j);
        const float b = ld(x, row + 2 * j + 1);
        re += a * c - b * s;
        im += a * s + b * c;
    }
    y[2 * idx] = cv(re);
    y[2 * idx + 1] = cv(im);
}
