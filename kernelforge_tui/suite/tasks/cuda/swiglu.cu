//@ Suite task swiglu's baseline (rows.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// A thread per element: silu(gate) * up with silu(a) = a / (1 + exp(-a)), as torch writes it.
extern "C" __global__ void swiglu_naive(const T* gate, const T* up, T* y, long long n) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) {
        const float a = ld(gate, i);
        y[i] = cv(a / (1.0f + expf(-a)) * ld(up, i));
    }
}
