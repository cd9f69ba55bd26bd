//@ A map task's baseline (activations.py): y[i] = f(x[i]) in fp32, $expression over v = x[i]; after the suite's
//@ prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

extern "C" __global__ void ${name}_naive(const T* x, T* y, int n) {
    // One thread per element, fp32 math, one rounding to T.
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = ld(x, i);
        y[i] = cv($expression);
    }
}
