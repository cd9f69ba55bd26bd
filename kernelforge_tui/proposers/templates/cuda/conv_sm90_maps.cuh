// CUTLASS's sm90 TMA warp-specialised mainloop (CollectiveMma<MainloopSm90TmaGmmaWarpSpecialized>) as an implicit
// GEMM convolution of stride 1: M = output pixels (n, p, q) row-major, N = output channels, K = filter taps (r, s)
// by input channels. Its A tile, TILE_M pixels by TILE_K channels of one tap, is BOXES 4-d TMA boxes of the
// channels-last input (TILE_K channels, BOX_W columns, BOX_H rows, BOX_N images), each at its run of pixels shifted
// by the tap: a box is a run of whole rows (or a part of one), so its rows land in shared memory in the tile's
// order, the K-major tile CUTLASS's wgmma reads, and what the padding puts outside the input (a negative or too
// large row or column, an image past the last) the TMA reads as zeros. Its B tile is the channels-last filter's
// [TILE_N output channels, one tap, TILE_K channels] box. Both maps are the harness's, encoded over x and weight
// themselves and passed by value (gemm_sm90_harness_maps.cuh says why). Everything but the producer's copies, the
// consumers' wgmma loop, the pipeline and the epilogue (which stores only rows inside M), is the base's.
#include "conv_sm90_boxes.cuh"
namespace kf {
using namespace cute;

template <class Base>
struct ConvMapsMainloop : Base {
    using MainloopPipeline = typename Base::MainloopPipeline;
    using PipelineState = typename Base::PipelineState;
    using TensorStorage = typename Base::TensorStorage;
    using SmemLayoutA = typename Base::SmemLayoutA;
    using SmemLayoutB = typename Base::SmemLayoutB;

    struct Params : Base::Params {
        TmaDescriptor const* map_a;  // x [n, h, w, c]: dims (c, w, h, n), box (TILE_K, BOX_W, BOX_H, BOX_N)
        TmaDescriptor const* map_b;  // weight [o, kh, kw, c]: dims (c, kw, kh, o), box (TILE_K, 1, 1, TILE_N)
    };
    // A stage's tile starts a whole tile after the last: the stage mode is the layouts' outermost
    static constexpr int kStageA = TILE_M * TILE_K;
    static constexpr int kStageB = TILE_N * TILE_K;
    static_assert(cute::cosize_v<SmemLayoutA> == kStageA * size<2>(SmemLayoutA{}), "A's stages lie tile after tile");
    static_assert(cute::cosize_v<SmemLayoutB> == kStageB * size<2>(SmemLayoutB{}), "B's stages lie tile after tile");
    static constexpr int kBoxPixels = BOX_W * BOX_H * BOX_N;
    static_assert(kBoxPixels * BOXES == TILE_M, "a tile's pixels are its boxes'");
    static_assert(kBoxPixels % 8 == 0, "a box starts on a swizzle atom of shared memory (8 rows)");
    static_assert(CHANNELS % TILE_K == 0, "a K tile is one tap's channels, never two taps'");

    __device__ __forceinline__ static void prefetch_tma_descriptors(Params const& params) {
        cute::prefetch_tma_descriptor(params.map_a);
        cute::prefetch_tma_descriptor(params.map_b);
    }

    template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
    __device__ __forceinline__ void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                                         cute::tuple<TensorA, TensorB> const&, BlockCoord const& blk_coord,
                                         KTileIterator k_tile_iter, int k_tile_count, int, uint32_t,
                                         TensorStorage& shared_tensors) {
        if (!cute::elect_one_sync()) {
            return;
        }
        constexpr uint64_t cache_hint = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);
        auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
        const int first = int(m_coord) * TILE_M;  // the tile's first output pixel, row-major over (n, p, q)
        const int channel_out = int(n_coord) * TILE_N;
#pragma unroll 1
        for (; k_tile_count > 0; --k_tile_count) {
            pipeline.producer_acquire(smem_pipe_write);
            uint64_t* barrier = pipeline.producer_get_barrier(smem_pipe_write);
            const int stage = smem_pipe_write.index();
            const Tap tap = tap_of(int(*k_tile_iter));
            auto* tile_a = shared_tensors.smem_A.data() + stage * kStageA;
#pragma unroll 1  // unrolled, BOXES copies' coordinates spill the 168 registers a thread has
            for (int box = 0; box < BOXES; ++box) {
                const Origin at = box_origin(first, box, tap);
                SM90_TMA_LOAD_4D::copy(params.map_a, barrier, cache_hint, tile_a + box * kBoxPixels * TILE_K,
                                       tap.channel, at.column, at.row, at.image);
            }
            SM90_TMA_LOAD_4D::copy(params.map_b, barrier, cache_hint, shared_tensors.smem_B.data() + stage * kStageB,
                                   tap.channel, tap.s, tap.r, channel_out);
            ++k_tile_iter;
            ++smem_pipe_write;
        }
    }
};
}  // namespace kf
