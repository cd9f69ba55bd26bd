//@ y = conv(x, w) (+ bias[o]) of a captured aten.convolution, 1-d or 2-d, a thread per output element, fp32 sums.
//@ Each tensor is read and written in the layout the model gave it (NCHW, channels-last or any other dense order):
//@ X_AT, W_AT and Y_AT are its element offsets, written by `baselines.convolution` from the captured memory order.
//@ Stride, padding, dilation and groups are the call's, baked in; a 1-d convolution is the 2-d one with H = KH = 1.
#include "prelude.cuh"
#define SH $sh
#define SW $sw
#define PH $ph
#define PW $pw
#define DH $dh
#define DW $dw
#define GROUPS $groups
#define X_AT(n, c, h, w) $x_at
#define W_AT(o, c, h, w) $w_at
#define Y_AT(n, o, h, w) $y_at

//@if bias
extern "C" __global__ void kf_capture_convolution(const T* __restrict__ x, const T* __restrict__ wt,
                                                  const T* __restrict__ bias, T* __restrict__ y, long long total,
                                                  int C, int H, int W, int O, int OH, int OW, int KH, int KW) {
//@else
extern "C" __global__ void kf_capture_convolution(const T* __restrict__ x, const T* __restrict__ wt, T* __restrict__ y,
                                                  long long total, int C, int H, int W, int O, int OH, int OW, int KH,
                                                  int KW) {
//@end
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= total) {
        return;
    }
    const int ow = (int)(i % OW);
    const int oh = (int)((i / OW) % OH);
    const int o = (int)((i / ((long long)OW * OH)) % O);
    const long long n = i / ((long long)OW * OH * O);
    const int CG = C / GROUPS;
    const int first = o / (O / GROUPS) * CG;
    float acc = 0.0f;
    for (int c = 0; c < CG; ++c) {
        for (int r = 0; r < KH; ++r) {
            const int ih = oh * SH - PH + r * DH;
            if (ih < 0 || ih >= H) {
                continue;
            }
            for (int s = 0; s < KW; ++s) {
                const int iw = ow * SW - PW + s * DW;
                if (iw >= 0 && iw < W) {
                    acc += ld(x, X_AT(n, first + c, ih, iw)) * ld(wt, W_AT(o, c, r, s));
                }
            }
        }
    }
//@if bias
    acc += ld(bias, o);
//@end
    y[Y_AT(n, o, oh, ow)] = cv(acc);
}
