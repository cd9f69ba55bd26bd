//@ y = softmax(SCALE q k^T [causal]) v of a captured scaled_dot_product_attention, a warp per query row (batch,
//@ head, i): each lane holds the row's dims lane, lane + 32, ... (up to 8 of them: head dims up to 256) of q and of the
//@ output, a key's score is a warp sum, and the softmax is online (running max and sum), all in fp32.
//@ Each tensor is read and written in the layout the model gave it: Q_AT, K_AT, V_AT and Y_AT are its element
//@ offsets, written by `baselines.attention` from the captured memory order.
#include "prelude.cuh"
#define SCALE $scale
#define CAUSAL $causal
#define REGS 8
#define WARPS 4
#define Q_AT(b, h, i, d) $q_at
#define K_AT(b, h, i, d) $k_at
#define V_AT(b, h, i, d) $v_at
#define Y_AT(b, h, i, d) $y_at

extern "C" __global__ void __launch_bounds__(32 * WARPS)
    kf_capture_attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ y,
                         long long rows, int H, int SQ, int SK, int D, int DV) {
    const long long row = (long long)blockIdx.x * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) {
        return;
    }
    const int i = (int)(row % SQ);
    const int h = (int)((row / SQ) % H);
    const long long b = row / ((long long)SQ * H);
    float qr[REGS];
    float acc[REGS];
#pragma unroll
    for (int r = 0; r < REGS; ++r) {
        const int d = lane + 32 * r;
        qr[r] = d < D ? ld(q, Q_AT(b, h, i, d)) : 0.0f;
        acc[r] = 0.0f;
    }
    float m = NEG_INF;
    float l = 0.0f;
    const int last = CAUSAL ? min(i + 1, SK) : SK;  // is_causal: key j <= query i (the top-left triangle, as torch)
    for (int j = 0; j < last; ++j) {
        float s = 0.0f;
#pragma unroll
        for (int r = 0; r < REGS; ++r) {
            const int d = lane + 32 * r;
            if (d < D) {
                s += qr[r] * ld(k, K_AT(b, h, j, d));
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) {
            s += __shfl_xor_sync(0xffffffffu, s, offset);
        }
        s *= SCALE;
        const float top = fmaxf(m, s);
        const float keep = m == NEG_INF ? 0.0f : expf(m - top);
        const float p = expf(s - top);
        l = l * keep + p;
#pragma unroll
        for (int r = 0; r < REGS; ++r) {
            const int d = lane + 32 * r;
            if (d < DV) {
                acc[r] = acc[r] * keep + p * ld(v, V_AT(b, h, j, d));
            }
        }
        m = s != s ? s : top;  // a NaN score makes the row NaN, as torch gives
    }
#pragma unroll
    for (int r = 0; r < REGS; ++r) {
        const int d = lane + 32 * r;
        if (d < DV) {
            y[Y_AT(b, h, i, d)] = cv(acc[r] / l);
        }
    }
}
