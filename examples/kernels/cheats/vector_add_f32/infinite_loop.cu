// CHEAT infinite_loop: spins forever on a volatile device flag that nothing ever clears (the compiler
// must re-read it every time, so the loop cannot be removed), then would compute c.
// expect: timeout -- the watchdog must kill the worker and the search must carry on.
__device__ volatile int kf_spin_forever = 1;

extern "C" __global__ void cheat_infinite_loop(const float* a, const float* b, float* c, int n) {
    while (kf_spin_forever != 0) {
    }
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}
