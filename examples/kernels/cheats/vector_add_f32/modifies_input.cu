// CHEAT modifies_input: computes c = a + b correctly, then overwrites a with zeros (a scratch-buffer
// habit, or a way to leave the next run an easier problem).
// expect: input_modified -- inputs must be compared with a saved copy after the launch (a rerun
// would also disagree: the second run computes 0 + b).
extern "C" __global__ void cheat_modifies_input(float* a, const float* b, float* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
        a[i] = 0.0f;
    }
}
