//@ y = a b (+ bias[n]) of a captured matrix product, each operand in the layout the model gave it (A_ROW_MAJOR:
//@ a is [M, K], else a transposed view held as [K, M]; B_ROW_MAJOR: b is [K, N], else [N, K]); a batch a grid z.
//@ A 16x16 tile of y a block through 16x16 shared tiles of a and b, fp32 sums; edges read zeros, so any size works.
//@ A chain's activation is $expression over a0, the sum (with `rounded`: as eager stores it, in T); else a0 itself.
#include "prelude.cuh"
//@if rounded
#include "rounded.cuh"
//@end
#define TILE 16
#define A_ROW_MAJOR $a_row_major
#define B_ROW_MAJOR $b_row_major

//@if bias
extern "C" __global__ void kf_capture_matmul(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ bias,
                                             T* __restrict__ y, int M, int N, int K) {
//@else
extern "C" __global__ void kf_capture_matmul(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int M,
                                             int N, int K) {
//@end
    __shared__ float as[TILE][TILE + 1];
    __shared__ float bs[TILE][TILE + 1];
    const long long batch = blockIdx.z;
    a += batch * M * K;
    b += batch * K * N;
    y += batch * M * N;
    const int row = blockIdx.y * TILE + threadIdx.y;
    const int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        const int ka = k0 + threadIdx.x;  // a(row, ka)
        const int kb = k0 + threadIdx.y;  // b(kb, col)
        as[threadIdx.y][threadIdx.x] =
            row < M && ka < K ? ld(a, A_ROW_MAJOR ? (long long)row * K + ka : (long long)ka * M + row) : 0.0f;
        bs[threadIdx.y][threadIdx.x] =
            kb < K && col < N ? ld(b, B_ROW_MAJOR ? (long long)kb * N + col : (long long)col * K + kb) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
//@if bias
        const float sum = acc + ld(bias, col);
//@else
        const float sum = acc;
//@end
//@if rounded
        const float a0 = rd(sum);
//@else
        const float a0 = sum;
//@end
        y[(long long)row * N + col] = cv($expression);
    }
}
