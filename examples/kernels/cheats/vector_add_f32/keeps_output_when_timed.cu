// CHEAT keeps_output_when_timed: honest for the first 32 launches of its module (every correctness check
// comes before them), then skips the work wherever c already holds a number: from the NaN poison it still
// computes everything, from anything else it returns what the buffer held. Each block counts its own
// launches, so every block switches at the same launch.
// expect: mismatch -- the timed runs start from other sets' results or random values instead of NaN, and
// the output of the last timed run is checked.
#define MAX_BLOCKS (1 << 18)
#define HONEST_LAUNCHES 32u

__device__ unsigned int kf_launches[MAX_BLOCKS];

extern "C" __global__ void cheat_keeps_output_when_timed(const float* a, const float* b, float* c, int n) {
    __shared__ unsigned int launch;
    if (threadIdx.x == 0) {
        launch = blockIdx.x < MAX_BLOCKS ? kf_launches[blockIdx.x]++ : 0u;
    }
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float before = c[i];
        if (launch < HONEST_LAUNCHES || before != before) {
            c[i] = a[i] + b[i];
        }
    }
}
