//@ Suite task softmax_attention's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#define HEAD_DIM 64  // the task's d at every scale; q and the output row are kept in registers

// A thread per query row (head, i): its scores against every key, twice (the max, then the sum of exp(s - max)
// and the exp-weighted sum of the value rows), then the division. Nothing is shared between threads but caches.
extern "C" __global__ void softmax_attention_naive(const T* q, const T* k, const T* v, T* o, int rows, int seq) {
    const int r = blockIdx.x * BLOCK + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const long long head = (long long)(r / seq) * seq * HEAD_DIM;
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    float qr[HEAD_DIM];
#pragma unroll
    for (int c = 0; c < HEAD_DIM; ++c) {
        qr[c] = ld(q, (long long)r * HEAD_DIM + c) * scale;
    }
    float m = NEG_INF;
    for (int j = 0; j < seq; ++j) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < HEAD_DIM; ++c) {
            s += qr[c] * ld(k, head + (long long)j * HEAD_DIM + c);
        }
        m = fmaxf(m, s);
    }
    float acc[HEAD_DIM];
#pragma unroll
    for (int c = 0; c < HEAD_DIM; ++c) {
        acc[c] = 0.0f;
    }
    float sum = 0.0f;
    for (int j = 0; j < seq; ++j) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < HEAD_DIM; ++c) {
            s += qr[c] * ld(k, head + (long long)j * HEAD_DIM + c);
        }
        const float p = expf(s - m);
        sum += p;
#pragma unroll
        for (int c = 0; c < HEAD_DIM; ++c) {
            acc[c] += p * ld(v, head + (long long)j * HEAD_DIM + c);
        }
    }
#pragma unroll
    for (int c = 0; c < HEAD_DIM; ++c) {
        o[(long long)r * HEAD_DIM + c] = cv(acc[c] / sum);
    }
}
