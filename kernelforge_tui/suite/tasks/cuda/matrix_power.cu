//@ Suite task matrix_power's baseline (dense.py), after the suite's prelude (T, ld, cv, BLOCK: capture/cuda/prelude.cuh).

#define POWER $power

// A block per row i of the result, one launch: row i of A^POWER is r = A[i, :] multiplied by A, POWER - 1
// times (r <- r A), each r[j] a thread's fp32 sum over a column of A. r lives in dynamic shared memory
// (2 n floats: the current row and the next), kept in fp32 between the steps, rounded to T once at the end.
// Chaining rows needs no grid-wide sync (squaring would: A^2 must be whole before (A^2)^2 starts); the cost is
// POWER - 1 vector-matrix products per row instead of two matrix products.
extern "C" __global__ void matrix_power_naive(const T* A, T* C, int n) {
    extern __shared__ float rows[];
    float* cur = rows;
    float* next = rows + n;
    const long long i = blockIdx.x;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        cur[j] = ld(A, i * n + j);
    }
    __syncthreads();
    for (int step = 1; step < POWER; ++step) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            float acc = 0.0f;
            for (int k = 0; k < n; ++k) {
                acc += cur[k] * ld(A, (long long)k * n + j);
            }
            next[j] = acc;
        }
        __syncthreads();  // every read of cur is done before the next step overwrites it
        float* done = cur;
        cur = next;
        next = done;
    }
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        C[i * n + j] = cv(cur[j]);
    }
}
