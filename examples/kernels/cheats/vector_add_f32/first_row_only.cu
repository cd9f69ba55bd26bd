// CHEAT first_row_only: writes only the first 1024 elements of c (the part a lazy check would look at).
// expect: mismatch -- the rest of c keeps its NaN poison; the whole output must be compared.
extern "C" __global__ void cheat_first_row_only(const float* a, const float* b, float* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && i < 1024) {
        c[i] = a[i] + b[i];
    }
}
