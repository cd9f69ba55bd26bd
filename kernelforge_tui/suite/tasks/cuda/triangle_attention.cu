//@ Suite task triangle_attention's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#define C_HEAD 32  // the task's c at every scale; q and the output row are kept in registers

// A thread per output row (i, j, h): its scores against the n keys of row i (plus the pair bias of (j, k)),
// twice (the max, then the sum of exp(s - max) and the exp-weighted sum of the value rows), then the division.
extern "C" __global__ void triangle_attention_naive(const T* q, const T* k, const T* v, const T* bias, T* o, int n,
                                                    int heads) {
    const long long r = (long long)blockIdx.x * BLOCK + threadIdx.x;  // (i * n + j) * heads + h
    if (r >= (long long)n * n * heads) {
        return;
    }
    const int h = (int)(r % heads);
    const long long j = (r / heads) % n;
    const long long i = r / ((long long)heads * n);
    const float scale = 1.0f / sqrtf((float)C_HEAD);
    float qr[C_HEAD];
#pragma unroll
    for (int c = 0; c < C_HEAD; ++c) {
        qr[c] = ld(q, r * C_HEAD + c);
    }
    float m = NEG_INF;
    for (int kk = 0; kk < n; ++kk) {
        const long long key = ((i * n + kk) * heads + h) * C_HEAD;
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < C_HEAD; ++c) {
            s += qr[c] * ld(k, key + c);
        }
        m = fmaxf(m, s * scale + ld(bias, (j * n + kk) * heads + h));
    }
    float acc[C_HEAD];
#pragma unroll
    for (int c = 0; c < C_HEAD; ++c) {
        acc[c] = 0.0f;
    }
    float sum = 0.0f;
    for (int kk = 0; kk < n; ++kk) {
        const long long key = ((i * n + kk) * heads + h) * C_HEAD;
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < C_HEAD; ++c) {
            s += qr[c] * ld(k, key + c);
        }
        const float p = expf(s * scale + ld(bias, (j * n + kk) * heads + h) - m);
        sum += p;
#pragma unroll
        for (int c = 0; c < C_HEAD; ++c) {
            acc[c] += p * ld(v, key + c);
        }
    }
#pragma unroll
    for (int c = 0; c < C_HEAD; ++c) {
        o[r * C_HEAD + c] = cv(acc[c] / sum);
    }
}
