//@ A wait for the phase of `parity` of a barrier: at the block's scope (the default acquire: the bulk copies' bytes),
//@ or with .acquire.cluster (what the cluster's other blocks stored is visible after it). Rendered on its own for
//@ each (group_norm.py).
//@if wait_why
// The bytes stored by other blocks of the cluster are visible after this wait.
//@end
__device__ __forceinline__ void $wait_name(uint64_t* bar, uint32_t parity) {
    asm volatile("{\n .reg .pred done;\n wait_%=:\n"
                 " mbarrier.try_wait.parity$wait_semantics.shared::cta.b64 done, [%0], %1;\n"
                 " @!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}
