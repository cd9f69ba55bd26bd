// CHEAT never_writes: reads the inputs but never writes c, hoping stale memory holds the answer.
// expect: mismatch -- outputs are poisoned with NaN before every launch, so c stays NaN.
extern "C" __global__ void cheat_never_writes(const float* a, const float* b, float* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && a[i] + b[i] == 12345.678f && c == nullptr) {
        c[0] = 0.0f;  // never true: keeps the parameters used
    }
}
