// NOT A CHEAT (control) reads_after_writing: writes b into c, then, after a barrier, adds a to the element
// its mirror thread in the block wrote. It reads its output, but only what this launch wrote there.
// expect: pass -- whatever c held before the launch is overwritten before anything reads it.
extern "C" __global__ void reads_after_writing(const float* a, const float* b, float* c, int n) {
    const int base = blockIdx.x * blockDim.x;
    const int i = base + threadIdx.x;
    if (i < n) {
        c[i] = b[i];
    }
    __syncthreads();
    const int j = base + (blockDim.x - 1 - threadIdx.x);
    if (j < n) {
        c[j] = a[j] + c[j];
    }
}
