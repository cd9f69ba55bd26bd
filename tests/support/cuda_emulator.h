// A CPU stand-in for CUDA launches: each thread of a block is a fiber (ucontext) run in turn on one OS thread,
// switching only at __syncthreads and warp shuffles, which are barriers over the block and the warp; blocks run
// one after another. A barrier some threads never reach, or a thread leaving while others wait at one, aborts.
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Before a kernel: its cluster's blocks, for its runner's launch (the namespace's, shadowing the global 1).
#define __cluster_dims__(x, y, z) constexpr unsigned emu_cluster_blocks = (x) * (y) * (z);
constexpr unsigned emu_cluster_blocks = 1;

struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) int2 {
    int x, y;
};
struct Dim3 {
    unsigned x, y, z;
};
using std::max;
using std::min;

// bf16 as its bits, converted as the GPU does (round to nearest even, NaN kept a NaN).
struct __nv_bfloat16 {
    uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 v) {
    const uint32_t b = uint32_t(v.bits) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return {uint16_t((b >> 16) | 0x40u)};
    }
    return {uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16)};
}

namespace emu {
// A fiber's stack is set up once by makecontext (entered by swapcontext); after that fibers and the scheduler switch
// by _setjmp/_longjmp, which skip swapcontext's signal-mask system calls.
struct Fiber {
    ucontext_t context;
    jmp_buf jump;
    std::unique_ptr<char[]> stack;  // not zeroed: a page is only backed once a fiber's stack reaches it
    bool started, finished;
};
std::vector<Fiber> fibers;
ucontext_t entry;
jmp_buf scheduler;
// `running` indexes the fibers of the cluster's blocks (its block: running / block_size); block_index is the
// cluster's first block.
unsigned block_index, block_size, grid_size, cluster_size, running;
unsigned order;  // 1: the cluster's blocks in reverse rank order first (see launch)
long events, cluster_generation, cluster_arrived, cluster_split_arrived, wakeups;
std::vector<long> block_generation, block_arrived, block_left, warp_generation, warp_arrived;
// Warp collectives' deposits (shuffles, ldmatrix, mma.sync): each thread's FRAGMENT bytes, in two alternating buffers.
constexpr size_t FRAGMENT = 64;
std::vector<unsigned char> fragments[2];
std::function<void()> kernel;

// Clustered kernels' shared memory: a block's arrays at the same offsets of its own arena.
constexpr size_t ARENA = size_t(1) << 20;
constexpr size_t STACK = size_t(1) << 16;
constexpr unsigned MAX_CLUSTER = 8;
alignas(256) unsigned char arena[MAX_CLUSTER][ARENA];
size_t arena_used;

[[noreturn]] void fail(const char* why) {
    std::fprintf(stderr, "emulator: %s (block %u, thread %u)\n", why, block_index + running / block_size,
                 running % block_size);
    std::exit(3);
}
// A __shared__ array's place in every block's arena, reserved when a kernel first declares it.
size_t reserve(size_t bytes) {
    const size_t at = (arena_used + 255) / 256 * 256;
    if (at + bytes > ARENA) fail("the clustered kernels' shared memory outgrew the emulator's arena");
    arena_used = at + bytes;
    return at;
}
template <typename S>
S& shared(size_t at) {
    return *reinterpret_cast<S*>(arena[running / block_size] + at);
}
template <typename E>
E* map_shared_rank(E* p, unsigned rank) {
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(p);
    const unsigned char* own = arena[running / block_size];
    if (bytes < own || bytes >= own + ARENA) fail("map_shared_rank of an address outside the block's shared memory");
    if (rank >= cluster_size) fail("map_shared_rank of a block outside the cluster");
    return reinterpret_cast<E*>(arena[rank] + (bytes - own));
}
void yield() {
    if (!_setjmp(fibers[running].jump)) _longjmp(scheduler, 1);
}
void start() {
    kernel();
    const unsigned block = running / block_size;
    if (block_arrived[block] != 0) fail("a thread left while others wait at __syncthreads");
    if (cluster_arrived != 0) fail("a thread left while others wait at cluster.sync()");
    fibers[running].finished = true;
    ++events;
    if (++block_left[block] == long(block_size) && cluster_size > 1) {
        std::memset(arena[block], 0xff, ARENA);  // released: NaN to whoever reads it now
    }
    _longjmp(scheduler, 1);
}
void launch(unsigned grid, unsigned block, std::function<void()> body, unsigned cluster = 1) {
    if (block % 32 != 0) fail("a block of part of a warp");
    if (cluster < 1 || cluster > MAX_CLUSTER || grid % cluster != 0) fail("a grid not of whole clusters");
    kernel = std::move(body);
    block_size = block;
    grid_size = grid;
    cluster_size = cluster;
    const unsigned threads = block * cluster;
    if (fibers.size() < threads) {
        fibers.resize(threads);
        for (Fiber& f : fibers) {
            if (!f.stack) f.stack.reset(new char[STACK]);
        }
    }
    for (std::vector<unsigned char>& deposits : fragments) deposits.resize(threads * FRAGMENT);  // written first
    for (block_index = 0; block_index < grid; block_index += cluster) {
        cluster_generation = cluster_arrived = cluster_split_arrived = 0;
        block_generation.assign(cluster, 0);
        block_arrived.assign(cluster, 0);
        block_left.assign(cluster, 0);
        warp_generation.assign(threads / 32, 0);
        warp_arrived.assign(threads / 32, 0);
        if (cluster > 1) {
            for (unsigned b = 0; b < cluster; ++b) std::memset(arena[b], 0xff, ARENA);  // uninitialised: NaN
        }
        for (unsigned t = 0; t < threads; ++t) {
            Fiber& f = fibers[t];
            f.started = f.finished = false;
            getcontext(&f.context);
            f.context.uc_stack.ss_sp = f.stack.get();
            f.context.uc_stack.ss_size = STACK;
            f.context.uc_link = nullptr;
            makecontext(&f.context, start, 0);
        }
        // Rounds over one block's fibers until it finishes or waits at cluster.sync(), blocks in turn: the first
        // block first between even-numbered cluster barriers, the last first between odd ones (so a block that
        // reads another's shared memory too early finds it not yet written, or already released); `order` 1 the
        // other way round (a runner may launch both ways: an output written by two blocks then differs).
        std::vector<bool> waiting(cluster, false);
        long seen = wakeups;
        for (long generation = cluster_generation;;) {
            unsigned live = 0, next = cluster;
            for (unsigned k = 0; k < cluster; ++k) {
                const unsigned b = (generation + order) % 2 ? cluster - 1 - k : k;
                if (block_left[b] == long(block)) continue;
                ++live;
                if (!waiting[b] && next == cluster) next = b;
            }
            if (live == 0) break;
            if (next == cluster) fail("deadlock: a barrier some threads never reach");
            const long before = events;
            for (running = next * block; running < (next + 1) * block; ++running) {
                Fiber& f = fibers[running];
                if (f.finished) continue;
                if (!_setjmp(scheduler)) {
                    if (f.started) _longjmp(f.jump, 1);
                    f.started = true;
                    swapcontext(&entry, &f.context);
                }
            }
            if (cluster_generation != generation) {
                generation = cluster_generation;
                waiting.assign(cluster, false);
            } else if (wakeups != seen) {  // a barrier's phase completed: whoever waits on it may go on
                seen = wakeups;
                waiting.assign(cluster, false);
            } else if (events == before) {
                waiting[next] = true;  // its threads all wait at cluster.sync() (or never get past a barrier)
            }
        }
    }
}
// A launch that a clustered kernel makes twice, its blocks in one order and then the other (`order`): the
// output's bytes must come out the same (a block's results do not depend on when the others run), else some were
// written by two blocks. `before` readies the output for each launch.
void launch_in_both_orders(unsigned grid, unsigned block, const std::function<void()>& body, unsigned cluster,
                           const void* output, size_t bytes, const std::string& name,
                           const std::function<void()>& before = [] {}) {
    std::vector<char> first;
    for (order = 0; order < (cluster > 1 ? 2u : 1u); ++order) {
        before();
        launch(grid, block, body, cluster);
        const char* now = static_cast<const char*>(output);
        if (order == 0) {
            first.assign(now, now + bytes);
        } else if (std::memcmp(first.data(), now, bytes) != 0) {
            std::fprintf(stderr, "the output differs with the cluster's blocks in the other order: %s\n", name.c_str());
            std::exit(4);
        }
    }
    order = 0;
}
// A barrier over the cluster's every thread (cluster.sync()).
void cluster_sync() {
    const long generation = cluster_generation;
    ++events;
    if (++cluster_arrived == long(block_size * cluster_size)) {
        cluster_arrived = 0;
        ++cluster_generation;
    } else {
        while (cluster_generation == generation) yield();
    }
}
// The split cluster barrier (barrier.cluster.arrive, later barrier.cluster.wait): a thread that arrives goes on; one
// that waits waits until every thread of the cluster has arrived (their arrival a new generation: the scheduler
// then runs the blocks that wait again).
void cluster_arrive() {
    ++events;
    if (++cluster_split_arrived == long(block_size * cluster_size)) ++cluster_generation;
}
void cluster_wait() {
    while (cluster_split_arrived < long(block_size * cluster_size)) yield();
}
// The barrier of a warp's collectives: the 32nd lane to arrive at `generation` opens the next one.
void warp_barrier(unsigned warp, long generation) {
    ++events;
    if (++warp_arrived[warp] == 32) {
        warp_arrived[warp] = 0;
        ++warp_generation[warp];
    } else {
        while (warp_generation[warp] == generation) yield();
    }
}
// A warp-wide gather, every collective's (shuffles, ldmatrix, mma.sync): every lane deposits `bytes` of its own,
// waits for the 32, and reads the warp's deposits (lane i's at i * FRAGMENT). Two consecutive collectives deposit in
// alternate buffers, so a lane running ahead never overwrites one not yet read.
const unsigned char* gather(const void* mine, size_t bytes) {
    const unsigned warp = running / 32;
    const long generation = warp_generation[warp];
    unsigned char* slot = fragments[generation & 1].data();
    std::memcpy(slot + size_t(running) * FRAGMENT, mine, bytes);
    warp_barrier(warp, generation);
    return slot + size_t(warp) * 32 * FRAGMENT;
}
// A warp-wide exchange: every lane gives its value and reads its source lane's.
template <typename V>
V exchange(unsigned mask, V value, int source) {
    static_assert(sizeof(V) <= 8, "shuffled values are 4 or 8 bytes");
    if (mask != 0xffffffffu) fail("a shuffle without the full mask");
    const unsigned char* all = gather(&value, sizeof(V));
    V out;
    std::memcpy(&out, all + size_t(source) * FRAGMENT, sizeof(V));
    return out;
}
// ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8 (8 16-bit elements); each lane gets, of
// matrix i, the pair at row lane / 4, columns 2 (lane % 4) and + 1 (transposed: rows 2 (lane % 4) and + 1 of column
// lane / 4), the first element in the low half.
template <typename E>
void ldmatrix(uint32_t (&r)[4], const E* row, bool transposed) {
    static_assert(sizeof(E) == 2, "ldmatrix .b16");
    if (reinterpret_cast<uintptr_t>(row) % 16) fail("an ldmatrix row address off 16-byte alignment");
    const unsigned char* all = gather(&row, sizeof(row));
    const unsigned lane = running % 32;
    for (int i = 0; i < 4; ++i) {
        uint16_t pair[2];
        for (int e = 0; e < 2; ++e) {
            const unsigned at_row = transposed ? 2 * (lane % 4) + e : lane / 4;
            const unsigned at_col = transposed ? lane / 4 : 2 * (lane % 4) + e;
            const E* rows;
            std::memcpy(&rows, all + size_t(8 * i + at_row) * FRAGMENT, sizeof(rows));
            std::memcpy(&pair[e], rows + at_col, 2);
        }
        r[i] = uint32_t(pair[0]) | uint32_t(pair[1]) << 16;
    }
}
inline float bf16_bits(uint32_t word, int half) {
    return __bfloat162float(__nv_bfloat16{uint16_t(word >> (16 * half))});
}
}  // namespace emu

#define threadIdx (Dim3{emu::running % emu::block_size, 0, 0})
#define blockIdx (Dim3{emu::block_index + emu::running / emu::block_size, 0, 0})
#define blockDim (Dim3{emu::block_size, 0, 0})
#define gridDim (Dim3{emu::grid_size, 0, 0})

void __syncthreads() {
    const unsigned block = emu::running / emu::block_size;
    const long generation = emu::block_generation[block];
    ++emu::events;
    if (++emu::block_arrived[block] == long(emu::block_size)) {
        emu::block_arrived[block] = 0;
        ++emu::block_generation[block];
    } else {
        while (emu::block_generation[block] == generation) emu::yield();
    }
}
namespace cooperative_groups {
struct cluster_group {
    void sync() const { emu::cluster_sync(); }
    unsigned block_rank() const { return emu::running / emu::block_size; }
    unsigned num_blocks() const { return emu::cluster_size; }
    template <typename E>
    E* map_shared_rank(E* p, unsigned rank) const {
        return emu::map_shared_rank(p, rank);
    }
};
inline cluster_group this_cluster() { return {}; }
}  // namespace cooperative_groups
// The kernels' sm_90 mbarrier helpers (EMULATED_HELPERS, whose PTX definitions kernel_namespace drops): a barrier's
// 8 bytes hold the bytes it still expects, its pending arrivals, and its arrival count with the phase in the top bit.
// A bulk copy or a store into another block lands at once; a wait yields till the phase of its parity completes.
// A block's shared memory starts as 0xff bytes: a barrier used before its initialisation shows as count 0x7fff.
namespace emu {
struct Mbarrier {
    int32_t tx;
    uint16_t pending, count_phase;
};
Mbarrier& mbarrier(uint64_t* bar) {
    Mbarrier& b = *reinterpret_cast<Mbarrier*>(bar);
    if ((b.count_phase & 0x7fff) == 0x7fff) fail("an mbarrier used before its initialisation");
    return b;
}
void complete_phase_if_done(Mbarrier& b) {
    if (b.pending == 0 && b.tx == 0) {
        b.count_phase ^= 0x8000;
        b.pending = b.count_phase & 0x7fff;
        ++wakeups;
    }
}
void complete_tx(uint64_t* bar, uint32_t bytes) {
    Mbarrier& b = mbarrier(bar);
    b.tx -= int32_t(bytes);
    ++events;
    complete_phase_if_done(b);
}
}  // namespace emu
inline void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
    *reinterpret_cast<emu::Mbarrier*>(bar) = {0, uint16_t(arrivals), uint16_t(arrivals)};
}
inline void mbarrier_init_fence() {}
inline void mbarrier_expect(uint64_t* bar, uint32_t bytes) {
    emu::Mbarrier& b = emu::mbarrier(bar);
    if (b.pending == 0) emu::fail("an arrival on an mbarrier whose phase has no arrival pending");
    b.tx += int32_t(bytes);
    --b.pending;
    ++emu::events;
    emu::complete_phase_if_done(b);
}
inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
    while (uint32_t(emu::mbarrier(bar).count_phase >> 15) == parity) emu::yield();
}
inline void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) { mbarrier_wait(bar, parity); }
inline void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    if (bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16) {
        emu::fail("a bulk copy off 16-byte alignment");
    }
    std::memcpy(dst, src, bytes);
    emu::complete_tx(bar, bytes);
}
inline uint32_t cluster_rank() { return emu::running / emu::block_size; }
inline void cluster_arrive_relaxed() { emu::cluster_arrive(); }
inline void cluster_wait() { emu::cluster_wait(); }
inline void send_word(const uint32_t* slot, uint32_t word, uint64_t* bar, uint32_t rank) {
    if (rank < emu::cluster_size && emu::block_left[rank] == long(emu::block_size)) {
        emu::fail("a store into the shared memory of a block that has left");
    }
    *const_cast<uint32_t*>(emu::map_shared_rank(slot, rank)) = word;
    emu::complete_tx(emu::map_shared_rank(bar, rank), 4);
}
template <typename V>
V __shfl_sync(unsigned mask, V v, int lane) {
    return emu::exchange(mask, v, lane & 31);
}
template <typename V>
V __shfl_xor_sync(unsigned mask, V v, int bits) {
    return emu::exchange(mask, v, int(emu::running % 32) ^ bits);
}
template <typename V>
V __shfl_down_sync(unsigned mask, V v, unsigned delta) {
    const unsigned lane = emu::running % 32;
    return emu::exchange(mask, v, int(lane + delta < 32 ? lane + delta : lane));
}
// A ballot: every lane's predicate exchanged with every lane (32 shuffles).
unsigned __ballot_sync(unsigned mask, int predicate) {
    unsigned bits = 0;
    for (int lane = 0; lane < 32; ++lane) {
        bits |= unsigned(emu::exchange(mask, predicate != 0, lane)) << lane;
    }
    return bits;
}
int __popc(unsigned bits) {
    return __builtin_popcount(bits);
}
template <typename V>
V __shfl_up_sync(unsigned mask, V v, unsigned delta) {
    const unsigned lane = emu::running % 32;
    return emu::exchange(mask, v, int(lane >= delta ? lane - delta : lane));
}
// The tensor-core kernels' PTX helpers (EMULATED_HELPERS): cp.async as a plain copy (zeros where not inside), its
// groups and waits as nothing (the copy has landed), ldmatrix and mma.sync m16n8k16 (bf16 in, fp32 sums) as warp
// collectives over the documented fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16").
template <typename E>
void copy16(E* dst, const E* src, bool inside) {
    if (reinterpret_cast<uintptr_t>(dst) % 16 || (inside && reinterpret_cast<uintptr_t>(src) % 16)) {
        emu::fail("a 16-byte cp.async off 16-byte alignment");
    }
    if (inside) {
        std::memcpy(dst, src, 16);
    } else {
        std::memset(dst, 0, 16);
    }
}
inline void copies_commit() {}
inline void copies_wait_but_one() {}
inline void copies_wait_all() {}
template <typename E>
void ldsm_x4(uint32_t (&r)[4], const E* row) {
    emu::ldmatrix(r, row, false);
}
template <typename E>
void ldsm_x4_trans(uint32_t (&r)[4], const E* row) {
    emu::ldmatrix(r, row, true);
}
// c += a b: lane (g, t) = (lane / 4, lane % 4) holds a's (g, 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8,
// 2t + 8..), b's (k 2t..2t+1, n g) and (k 2t + 8.., n g), c's (g, 2t..2t+1) and (g + 8, 2t..).
void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    const unsigned char* all = emu::gather(mine, sizeof(mine));
    auto word = [&](unsigned lane, int k) {
        uint32_t w;
        std::memcpy(&w, all + size_t(lane) * emu::FRAGMENT + 4 * k, 4);
        return w;
    };
    auto a_at = [&](unsigned row, unsigned col) {  // a[row][col], 16 x 16
        const unsigned lane = (row % 8) * 4 + (col % 8) / 2;
        return emu::bf16_bits(word(lane, (row / 8) + 2 * (col / 8)), col % 2);
    };
    auto b_at = [&](unsigned k, unsigned n) {  // b[k][n], 16 x 8
        return emu::bf16_bits(word(n * 4 + (k % 8) / 2, 4 + k / 8), k % 2);
    };
    const unsigned lane = emu::running % 32;
    for (int e = 0; e < 4; ++e) {
        const unsigned row = lane / 4 + 8 * (e / 2);
        const unsigned col = 2 * (lane % 4) + e % 2;
        float sum = c[e];
        for (unsigned k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
        c[e] = sum;
    }
}
float atomicAdd(float* p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}
template <typename V>
V __ldcs(const V* p) {
    return *p;
}
template <typename V>
V __ldg(const V* p) {
    return *p;
}
// cp.async as a plain copy: the copying thread alone reads the bytes back, after its wait.
void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
}
void __pipeline_commit() {}
void __pipeline_wait_prior(int) {}
float rsqrtf(float v) {
    return 1.0f / std::sqrt(v);
}
float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

std::vector<char> slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A copy of the bytes at a 256-byte aligned address, as cudaMalloc gives.
template <typename E>
E* aligned(const std::vector<char>& bytes) {
    void* p = std::aligned_alloc(256, (bytes.size() / 256 + 1) * 256);
    std::memcpy(p, bytes.data(), bytes.size());
    return static_cast<E*>(p);
}
