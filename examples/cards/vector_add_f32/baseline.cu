// vector_add_f32 baseline: deliberately naive, one element per thread, scalar loads.
// Plan: grid = cdiv(n, 256), block = 256.
extern "C" __global__ void vector_add_naive(const float* a, const float* b, float* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}
