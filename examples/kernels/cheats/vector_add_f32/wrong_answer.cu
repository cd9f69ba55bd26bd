// CHEAT wrong_answer: computes c = a - b instead of a + b.
// expect: mismatch -- the correctness check against the reference must fail on every input set.
extern "C" __global__ void cheat_wrong_answer(const float* a, const float* b, float* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] - b[i];
    }
}
