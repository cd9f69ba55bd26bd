// CHEAT out_of_bounds: correct c, but the last thread also writes 4 floats past the end of c.
// expect: out_of_bounds -- the guard bytes after the output buffer must be found changed (or
// compute-sanitizer memcheck reports the write); the values of c alone are correct.
extern "C" __global__ void cheat_out_of_bounds(const float* a, const float* b, float* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
    if (i == n - 1) {
        for (int k = 0; k < 4; ++k) {
            c[n + k] = 1.0f;
        }
    }
}
