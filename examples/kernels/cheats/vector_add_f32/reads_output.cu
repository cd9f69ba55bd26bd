// CHEAT reads_output: treats its output as an accumulator that starts empty: it adds a + b to whatever c
// already holds, reading a NaN as nothing. From the NaN poison that is the right answer.
// expect: mismatch -- the second run on the first set starts from another set's results instead of NaN,
// and it adds a + b to them.
extern "C" __global__ void cheat_reads_output(const float* a, const float* b, float* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float before = c[i];
        c[i] = (before == before ? before : 0.0f) + a[i] + b[i];
    }
}
