// softmax baseline (fp32): deliberately naive. One thread per row, three passes over the row
// (max, sum of exponentials, write), accurate expf, no vector loads, no cooperation between threads.
// Plan: grid = cdiv(rows, 32), block = 32. Correct for any rows and cols.
extern "C" __global__ void softmax_naive_f32(const float* x, float* y, int rows, int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) {
        return;
    }
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    float m = xr[0];
    for (int j = 1; j < cols; ++j) {
        m = fmaxf(m, xr[j]);
    }
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) {
        s += expf(xr[j] - m);
    }
    for (int j = 0; j < cols; ++j) {
        yr[j] = expf(xr[j] - m) / s;
    }
}
