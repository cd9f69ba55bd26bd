// Where conv_sm90_maps.cuh's producer copies from: the K tile's filter tap and channels, and the input origin of
// each box of an A tile (plain integer arithmetic over the render's constants, so that a host program checks it
// against an im2col of the convolution: tests/proposers/templates/test_conv_sm90.py).
namespace kf {
// K tile k_tile: tap (r, s) of the filter and its first channel (K runs over taps, each tap's channels inside).
struct Tap {
    int r, s, channel;
};
__host__ __device__ __forceinline__ Tap tap_of(int k_tile) {
    const int tap = k_tile / (CHANNELS / TILE_K);
    return {tap / FILTER_W, tap % FILTER_W, k_tile % (CHANNELS / TILE_K) * TILE_K};
}

// Box `box` of the A tile whose first output pixel (row-major over n, p, q) is `first`, for tap (r, s): the input
// column, row and image of its first element, at stride 1 (outside the input where the padding lies).
struct Origin {
    int column, row, image;
};
__host__ __device__ __forceinline__ Origin box_origin(int first, int box, Tap tap) {
    const int pixel = first + box * BOX_W * BOX_H * BOX_N;
    const int image = pixel / (OUT_H * OUT_W);
    const int row = pixel % (OUT_H * OUT_W) / OUT_W;
    const int column = pixel % OUT_W;
    return {column + tap.s * DILATION_W - PADDING_W, row + tap.r * DILATION_H - PADDING_H, image};
}
}  // namespace kf
