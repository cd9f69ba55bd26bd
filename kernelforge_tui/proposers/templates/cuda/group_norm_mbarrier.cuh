//@ The raw mbarrier operations the bulk copies and the cluster exchanges complete on (PTX: libcu++'s cuda::barrier
//@ has every thread of the block arrive, and ptxas keeps that cost).
// sm_90 mbarriers: a phase completes once its arrivals have arrived and the bytes they expect have
// landed (a bulk copy's, or the stores of a cluster's blocks); waiting on the phase then makes those bytes visible.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// The initialised barriers visible to the cluster's blocks and to bulk copies.
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival, which expects `bytes` more to land.
__device__ __forceinline__ void mbarrier_expect(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
