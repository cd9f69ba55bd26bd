//@ Suite task monte_carlo_integration's baseline (numerics.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

// One block: the output is a single value and is not zeroed before a launch, so a thread per point with an
// atomicAdd into it has nothing to add onto. Each thread sums f over every BLOCK-th point (fp32), a tree in shared
// memory adds the threads' sums, thread 0 writes the mean. At 2^20 points, 4096 per thread: well under 10 ms.
extern "C" __global__ void monte_carlo_integration_naive(const T* points, T* estimate, int n, int d) {
    __shared__ float sh[BLOCK];
    const int t = threadIdx.x;
    float s = 0.0f;
    for (long long i = t; i < n; i += BLOCK) {
        float r2 = 0.0f;
        for (int a = 0; a < d; ++a) {
            const float v = ld(points, i * d + a);
            r2 += v * v;
        }
        s += expf(-r2);
    }
    sh[t] = s;
    __syncthreads();
    for (int h = BLOCK / 2; h > 0; h >>= 1) {
        if (t < h) {
            sh[t] += sh[t + h];
        }
        __syncthreads();
    }
    if (t == 0) {
        estimate[0] = cv(sh[0] / (float)n);
    }
}
