// Start the copies of one group's slice (chunks [lo, lo + kept_chunks) of the group at xg) into dst:
// each thread copies the chunks it will read back, so no barrier guards the buffer, only the thread's own wait.
__device__ __forceinline__ void load_slice(VecT* __restrict__ dst, const T* __restrict__ xg, long long lo,
                                           int kept_chunks) {
const VecT* __restrict__ xs = reinterpret_cast<const VecT*>(xg) + lo;
#pragma unroll
for (int k = 0; k < ITEMS; ++k) {
 const int r = threadIdx.x + k * BLOCK;
 if (r < kept_chunks) { __pipeline_memcpy_async(&dst[r], xs + r, sizeof(VecT)); }
}
}
