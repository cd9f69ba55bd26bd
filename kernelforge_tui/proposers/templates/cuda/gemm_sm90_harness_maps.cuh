// CUTLASS's sm90 TMA warp-specialised mainloop (CollectiveMma<MainloopSm90TmaGmmaWarpSpecialized>), reading its
// A and B tiles through the tensor maps the harness encoded and passed by value (the entry's __grid_constant__
// parameters), not through the copies its Params holds.
// Why a derived collective: CUTLASS's Params keeps each map by value inside the TMA's Copy_Traits and hands the TMA
// instruction that member's address. A candidate builds its Params on the device, in local memory, and a TMA reads
// its map only from param, constant or global memory; so the producer's two copies take the harness's map instead
// (Copy_Traits' own `with(descriptor, barrier, mask)`, the overload CUTLASS's pointer-array GEMM uses). Everything
// else, the shared storage, the consumers' wgmma loop, the pipeline and the tails, is the base's. `load` restates
// the base's producer loop (CUTLASS 4.2, sm90_mma_tma_gmma_ss_warpspecialized.hpp) with those two copies changed.
namespace kf {
using namespace cute;

template <class Base>
struct HarnessMapsMainloop : Base {
    using MainloopPipeline = typename Base::MainloopPipeline;
    using PipelineState = typename Base::PipelineState;
    using TensorStorage = typename Base::TensorStorage;
    using DispatchPolicy = typename Base::DispatchPolicy;
    using GmemTiledCopyA = typename Base::GmemTiledCopyA;
    using GmemTiledCopyB = typename Base::GmemTiledCopyB;
    using SmemLayoutA = typename Base::SmemLayoutA;
    using SmemLayoutB = typename Base::SmemLayoutB;
    using ClusterShape = typename DispatchPolicy::ClusterShape;

    struct Params : Base::Params {
        TmaDescriptor const* map_a;  // the harness's maps: addresses of the entry's __grid_constant__ parameters
        TmaDescriptor const* map_b;
    };
    // What the base's Params keep of the TMA beside the map, the strides from a tile's coordinates to the map's, is
    // static for these layouts: a default-constructed copy maps coordinates as CUTLASS's host code would make it.
    static_assert(is_static_v<decltype(Params{}.tma_load_a.aux_params_.g_stride_)> &&
                      is_static_v<decltype(Params{}.tma_load_b.aux_params_.g_stride_)>,
                  "the TMA's coordinate strides are data: build them here as make_tma_copy would");

    __device__ __forceinline__ static void prefetch_tma_descriptors(Params const& params) {
        cute::prefetch_tma_descriptor(params.map_a);
        cute::prefetch_tma_descriptor(params.map_b);
    }

    template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
    __device__ __forceinline__ void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                             cute::tuple<TensorA, TensorB> const& load_inputs, BlockCoord const& blk_coord,
                             KTileIterator k_tile_iter, int k_tile_count, int thread_idx, uint32_t block_rank_in_cluster,
                             TensorStorage& shared_tensors) {
        if (!cute::elect_one_sync()) {
            return;
        }
        Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
        Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
        constexpr uint32_t cluster_x = size<0>(ClusterShape{});
        const uint2 in_cluster = {block_rank_in_cluster % cluster_x, block_rank_in_cluster / cluster_x};
        auto block_tma_a = params.tma_load_a.get_slice(in_cluster.y);
        auto block_tma_b = params.tma_load_b.get_slice(in_cluster.x);
        auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
        Tensor tAgA = block_tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord));
        Tensor tAsA = block_tma_a.partition_D(sA);
        Tensor tBgB = block_tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord));
        Tensor tBsB = block_tma_b.partition_D(sB);
        uint16_t mcast_mask_a = 0, mcast_mask_b = 0;
        auto block_layout = Layout<ClusterShape>{};  // (m, n) -> block rank
        if constexpr (is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
            for (int n = 0; n < size<1>(block_layout); ++n) {
                mcast_mask_a |= uint16_t(1) << block_layout(in_cluster.x, n, Int<0>{});
            }
        }
        if constexpr (is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
            for (int m = 0; m < size<0>(block_layout); ++m) {
                mcast_mask_b |= uint16_t(1) << block_layout(m, in_cluster.y, Int<0>{});
            }
        }
#pragma unroll 1
        for (; k_tile_count > 0; --k_tile_count) {
            pipeline.producer_acquire(smem_pipe_write);
            auto* barrier = pipeline.producer_get_barrier(smem_pipe_write);
            const int stage = smem_pipe_write.index();
            copy(params.tma_load_a.with(params.map_a, *barrier, mcast_mask_a), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
            copy(params.tma_load_b.with(params.map_b, *barrier, mcast_mask_b), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
            ++k_tile_iter;
            ++smem_pipe_write;
        }
    }
};
}  // namespace kf
