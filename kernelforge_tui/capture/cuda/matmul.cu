//@ y = a b (+ bias[n]) of a captured matrix product, each operand in the layout the model gave it (A_ROW_MAJOR:
//@ a is [M, K], else a transposed view held as [K, M]; B_ROW_MAJOR: b is [K, N], else [N, K]); a batch a grid z.
//@ A 16x16 tile of y a block through 16x16 shared tiles of a and b, fp32 sums; edges read zeros, so any size works.
//@ A chain's activation is $expression over a0, the sum (with `rounded`: as eager stores it, in T); else a0 itself.
//@ baddbmm's (`scaled`): y = BETA c + ALPHA a b, c read at C_AT(batch, row, col) (its broadcast dims read at 0).
#include "prelude.cuh"
//@if rounded
#include "rounded.cuh"
//@end
#define TILE 16
#define A_ROW_MAJOR $a_row_major
#define B_ROW_MAJOR $b_row_major
//@if scaled
#define BETA $beta
#define ALPHA $alpha
#define C_AT(batch, row, col) $c_at
//@end

//@if bias
extern "C" __global__ void kf_capture_matmul(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ bias,
                                             T* __restrict__ y, int M, int N, int K) {
//@end
//@if scaled
extern "C" __global__ void kf_capture_matmul(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c,
                                             T* __restrict__ y, int M, int N, int K) {
//@end
//@if plain
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
//@end
//@if scaled
        const float sum = (BETA == 0.0f ? 0.0f : BETA * ld(c, C_AT(batch, row, col))) + ALPHA * acc;  // beta 0: c unread
//@end
//@if plain
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
