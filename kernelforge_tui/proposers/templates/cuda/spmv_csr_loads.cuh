//@ How CSR SpMV reads: ONCE for values and col_idx (read once), GATHER for x, and Pack, VEC entries a load.

//@if stream_hint
// Entries are read once: evict-first, so x stays in L2; x through the read-only path.
#define ONCE(p) __ldcs(p)
#define GATHER(p) __ldg(p)
//@else
// Entries are read once: plain loads.
#define ONCE(p) *(p)
#define GATHER(p) *(p)
//@end

// Word<B>: what one load of B bytes reads (16 bytes and more: 16-byte words).
template <int B>
struct Word {
    typedef int4 type;
};
template <>
struct Word<8> {
    typedef int2 type;
};
template <>
struct Word<4> {
    typedef int type;
};
template <>
struct Word<2> {
    typedef unsigned short type;
};

// VEC consecutive entries of values or col_idx from a multiple of VEC (so aligned), read as whole words.
template <typename E>
union Pack {
    typedef typename Word<sizeof(E) * VEC>::type W;
    E e[VEC];
    W w[sizeof(E) * VEC > 16 ? sizeof(E) * VEC / 16 : 1];

    __device__ Pack() {}
    __device__ __forceinline__ void load(const E* __restrict__ base, int q) {
        const W* words = reinterpret_cast<const W*>(base + q);
#pragma unroll
        for (int k = 0; k < int(sizeof(w) / sizeof(W)); ++k) {
            w[k] = ONCE(words + k);
        }
    }
};
