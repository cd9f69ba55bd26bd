// The conv_sm90 producer's box arithmetic (cuda/conv_sm90_boxes.cuh, pasted in as boxes.cuh with the render's
// constants as -D flags) against the convolution's im2col, on the host: every A tile a producer would copy, each box
// read as a tiled TMA box reads (zeros outside the tensor), must hold the im2col rows of its output pixels, and every
// B tile the filter's rows of its output channels. The card's own sizes come as -DCARD_N ... -DCARD_O.
// Prints the first difference and exits 1, or prints the tiles checked and exits 0.
#define __host__
#define __device__
#define __forceinline__ inline
#include <cstdio>
#include <vector>

#include "boxes.cuh"

// x [n, h, w, c] and weight [o, kh, kw, c] with every element distinct and none zero
static float x_at(int n, int h, int w, int c) { return 1.0f + c + CHANNELS * (w + CARD_W * (h + CARD_H * n)); }
static float weight_at(int o, int r, int s, int c) { return -1.0f - (c + CHANNELS * (s + FILTER_W * (r + CARD_KH * o))); }

// One element of a tiled TMA box: the tensor's, or zero outside it.
static float x_or_zero(int n, int h, int w, int c) {
    const bool inside = n >= 0 && n < CARD_N && h >= 0 && h < CARD_H && w >= 0 && w < CARD_W && c >= 0 && c < CHANNELS;
    return inside ? x_at(n, h, w, c) : 0.0f;
}

int main() {
    const int pixels = CARD_N * OUT_H * OUT_W, k_tiles = CARD_KH * FILTER_W * CHANNELS / TILE_K;
    const int box_pixels = BOX_W * BOX_H * BOX_N;
    long checked = 0;
    for (int first = 0; first < pixels; first += TILE_M) {
        for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
            const kf::Tap tap = kf::tap_of(k_tile);
            std::vector<float> tile(TILE_M * TILE_K, -7.0f);
            for (int box = 0; box < BOXES; ++box) {
                const kf::Origin at = kf::box_origin(first, box, tap);
                for (int b = 0; b < BOX_N; ++b)
                    for (int h = 0; h < BOX_H; ++h)
                        for (int w = 0; w < BOX_W; ++w)
                            for (int c = 0; c < TILE_K; ++c) {
                                const int row = box * box_pixels + w + BOX_W * (h + BOX_H * b);
                                tile[row * TILE_K + c] = x_or_zero(at.image + b, at.row + h, at.column + w, tap.channel + c);
                            }
            }
            for (int m = 0; m < TILE_M && first + m < pixels; ++m) {
                const int pixel = first + m, n = pixel / (OUT_H * OUT_W), p = pixel / OUT_W % OUT_H, q = pixel % OUT_W;
                for (int c = 0; c < TILE_K; ++c) {
                    const int k = k_tile * TILE_K + c, r = k / CHANNELS / FILTER_W, s = k / CHANNELS % FILTER_W;
                    const int h = p + r * DILATION_H - PADDING_H, w = q + s * DILATION_W - PADDING_W;
                    const float want = x_or_zero(n, h, w, k % CHANNELS);  // im2col: K runs over (r, s, channel)
                    if (tile[m * TILE_K + c] != want) {
                        std::printf("A tile at pixel %d, K tile %d (tap %d,%d channel %d): row %d channel %d holds %g, "
                                    "im2col %g\n", first, k_tile, tap.r, tap.s, tap.channel, m, c, tile[m * TILE_K + c], want);
                        return 1;
                    }
                }
            }
            // the filter's box (TILE_K channels, tap s, tap r, output channels): its rows must be the filter's
            // [o, K] rows in the K order A's are
            for (int o = 0; o < CARD_O; ++o)
                for (int c = 0; c < TILE_K; ++c) {
                    const int k = k_tile * TILE_K + c;
                    const float want = weight_at(o, k / CHANNELS / FILTER_W, k / CHANNELS % FILTER_W, k % CHANNELS);
                    if (weight_at(o, tap.r, tap.s, tap.channel + c) != want) {
                        std::printf("B at K tile %d: channel %d of output channel %d differs\n", k_tile, c, o);
                        return 1;
                    }
                }
            ++checked;
        }
    }
    std::printf("%ld tiles checked\n", checked);
    return 0;
}
