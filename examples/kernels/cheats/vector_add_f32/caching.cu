// CHEAT caching: the first launch computes c correctly and keeps a copy of its first 2^23 elements (what fits
// under the build's cap on __device__ globals) in a __device__ buffer; every later launch from the same loaded
// module copies that saved part, whatever the inputs are now.
// expect: mismatch -- on the second input set (fresh seeds) launched from the same module; the first
// set and repeated timing launches on it look correct and the answer is stable across runs.
#define CACHE_N (1 << 23)
#define BLOCK 256

__device__ float kf_cache[CACHE_N];
__device__ int kf_block_done[CACHE_N / BLOCK];

extern "C" __global__ void cheat_caching(const float* a, const float* b, float* c, int n) {
    __shared__ int done;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool cacheable = blockIdx.x < CACHE_N / BLOCK && i < CACHE_N;
    if (threadIdx.x == 0) {
        done = blockIdx.x < CACHE_N / BLOCK ? kf_block_done[blockIdx.x] : 0;
    }
    __syncthreads();
    if (done) {
        if (i < n && cacheable) {
            c[i] = kf_cache[i];
        }
        return;
    }
    if (i < n) {
        c[i] = a[i] + b[i];
        if (cacheable) {
            kf_cache[i] = c[i];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x < CACHE_N / BLOCK) {
        __threadfence();
        kf_block_done[blockIdx.x] = 1;
    }
}
