//@ A clustered kernel's reduction: pushed, not pulled. Pulling (each block's part read by the others through
//@ distributed shared memory) needs a cluster barrier before the reads and one after them before any block may exit;
//@ a push needs neither, only each block's wait for its own parts, and one relaxed cluster barrier at the start
//@ (arrived at once, waited for while the slice's copies are in flight) so that no store finds a barrier not yet
//@ initialised. A block exits only after its last wait, so no store lands in a block gone. Every block merges the
//@ same parts in rank order: all get the same statistics and take the same branch.
// A reduction's exchange across the cluster: every block stores its block result into every
// block's parts[its rank] (st.async, landing on the receiver's barrier), then waits on its own for all SPLIT parts.
template <typename S>
struct Part {
    uint64_t bar;
    S parts[SPLIT];
};
template <typename S>
using Exchange = Part<S>;
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
// One 32-bit word into block `rank`'s copy of *slot, landing on its copy of *bar.
__device__ __forceinline__ void send_word(const uint32_t* slot, uint32_t word, uint64_t* bar, uint32_t rank) {
    uint32_t to, at;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to) : "r"(smem_addr(slot)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(at) : "r"(smem_addr(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 ::"r"(to), "r"(word), "r"(at) : "memory");
}
// One thread, before the cluster barrier: the barrier expects one arrival, its own, and the SPLIT parts' bytes.
template <typename S>
__device__ __forceinline__ void exchange_init(Part<S>* ex) {
    mbarrier_init(&ex->bar, 1);
    mbarrier_expect(&ex->bar, SPLIT * sizeof(S));
}
template <typename S>
__device__ __forceinline__ S reduce_all(S v, S* red, Part<S>* ex) {
    v = group_reduce<BLOCK>(v, red);
    if (threadIdx.x < SPLIT) {  // thread r sends the block's result to block r
        uint32_t words[sizeof(S) / 4];
        memcpy(words, &v, sizeof(S));
        const uint32_t* slot = reinterpret_cast<const uint32_t*>(&ex->parts[cluster_rank()]);
#pragma unroll
        for (int k = 0; k < (int)(sizeof(S) / 4); ++k) {
            send_word(slot + k, words[k], &ex->bar, threadIdx.x);
        }
    }
    mbarrier_wait_cluster(&ex->bar, 0);
    v = ex->parts[0];
#pragma unroll
    for (int r = 1; r < SPLIT; ++r) {
        v = S::combine(v, ex->parts[r]);
    }
    return v;
}
