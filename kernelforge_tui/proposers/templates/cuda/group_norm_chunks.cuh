//@ The thread's chunks of its group and the passes over them: every statistics pass and the normalising one is
//@ `chunks.pass<FIRST>(body)`, body(i, f) with chunk i (of the group when rereading, of the block's slice on chip)
//@ widened into f.
// op(v) on each widened value of a chunk, unrolled.
template <typename Op>
__device__ __forceinline__ void each(const float (&f)[VEC], Op op) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        op(f[j]);
    }
}

// y = (x - mean) * (gamma * rstd) + beta on a chunk of one channel: x - mean is exact on a constant group, where
// torch's x * a + (beta - mean * a) cancels in fp32's last bits.
__device__ __forceinline__ void normalise(float (&f)[VEC], T gamma, T beta, float mean, float rstd) {
    const float g = to_f(gamma) * rstd;
    const float b = to_f(beta);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        f[j] = fmaf(f[j] - mean, g, b);
    }
}

//@if reread
// The thread's chunks [lo, hi) of the group, read from memory in every pass.
struct Chunks {
    const T* __restrict__ xg;
    long long lo, hi;

    template <bool FIRST, typename Body>
    __device__ __forceinline__ void pass(Body body) const {
        for (long long i = lo + threadIdx.x; i < hi; i += BLOCK) {
            float f[VEC];
            load_chunk(xg, i, f);
            body(i, f);
        }
    }
};
//@else
// The thread's chunks of the block's slice (chunks [lo, lo + kept_chunks) of the group): chunk r = threadIdx.x +
// k * BLOCK of the first on_chip kept on chip (in registers: the thread's kept[k]; in shared memory: kept[r]), the
// rest read from memory in every pass.
struct Chunks {
//@if registers
    VecT (&kept)[ITEMS];
//@else
    VecT* __restrict__ kept;
//@end
    const T* __restrict__ xg;
    long long lo;
    int kept_chunks;
    int on_chip;
//@if bulk
    uint64_t* copy_bar;
//@end
//@if sliced

    // The copies of the slice's first on_chip chunks (xs: the slice's first) onto the chip (bulk: the setup has
    // readied copy_bar).
    __device__ __forceinline__ void keep(const VecT* __restrict__ xs) const {
//@if bulk
        if (threadIdx.x == 0) {  // one thread copies the block's chunks, which land on copy_bar
            const uint32_t bytes = (uint32_t)(sizeof(VecT) * on_chip);
            mbarrier_expect(copy_bar, bytes);
            bulk_load(kept, xs, bytes, copy_bar);
        }
//@else
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int r = threadIdx.x + k * BLOCK;
            if (r < on_chip) {
//@if registers
                kept[k] = xs[r];
//@else
                // every copy in flight at once, none through registers; each thread reads back its own
                __pipeline_memcpy_async(&kept[r], xs + r, sizeof(VecT));
//@end
            }
        }
//@if smem
        __pipeline_commit();
//@end
//@end
    }
//@end
//@if shared_wait

    // The wait for the block's copies into shared memory.
    __device__ __forceinline__ void wait() const {
//@if bulk
        mbarrier_wait(copy_bar, 0);
//@else
        __pipeline_wait_prior(0);
//@end
    }
//@end

    // A pass over the kept chunks, the loop that kept them; with a tail (KEPT), over the rest too, loaded from DRAM
    // in the FIRST pass, which loads them while the copies into shared memory are in flight and then waits for
    // those, and from L2 in the later passes (the tails of the blocks in flight are a few MB).
    template <bool FIRST, typename Body>
    __device__ __forceinline__ void pass(Body body) const {
//@if tail
        if constexpr (FIRST) {
            rest(body);
            wait();
        }
//@end
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int r = threadIdx.x + k * BLOCK;
            if (r < on_chip) {
                float f[VEC];
//@if registers
                widen(kept[k], f);
//@else
                widen(kept[r], f);
//@end
                body(r, f);
            }
        }
//@if tail
        if constexpr (!FIRST) {
            rest(body);
        }
//@end
    }
//@if tail

    // The slice's chunks from KEPT on, which shared memory does not hold.
    template <typename Body>
    __device__ __forceinline__ void rest(Body body) const {
        for (int r = KEPT + threadIdx.x; r < kept_chunks; r += BLOCK) {
            float f[VEC];
            load_chunk(xg, lo + r, f);
            body(r, f);
        }
    }
//@end
};
//@end
