// Probe (bench/tma_probe.py): can device code make a TMA tensor map by itself? A candidate has no host, so a TMA
// GEMM candidate would have to: zero 128 bytes of global memory, fill the fields with tensormap.replace (sm_90a),
// then load through it. kf_probe_build writes VARIANTS such maps of a 2-D bf16 tensor, one per guess at how PTX
// encodes the fields (the value or the value less one for the rank, box and element strides; the driver's or a
// shifted element type code), for the host to compare byte by byte with the driver's own encoding;
// kf_probe_load loads one box through a map and writes it out; kf_probe_load_param through a map passed by value.
#include <cuda_bf16.h>
#include <stdint.h>

#define VARIANTS 4

template <int ELEMTYPE>
__device__ __forceinline__ void replace_fields(char* map, const void* address, uint32_t rows, uint32_t cols,
                                               uint64_t row_bytes, uint32_t box_rows, uint32_t box_cols,
                                               uint32_t less) {
    for (int i = 0; i < 16; ++i) {
        reinterpret_cast<uint64_t*>(map)[i] = 0;
    }
    asm volatile("tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;" ::"l"(map), "l"(address));
    asm volatile("tensormap.replace.tile.rank.global.b1024.b32 [%0], %1;" ::"l"(map), "r"(2 - less));
    asm volatile("tensormap.replace.tile.box_dim.global.b1024.b32 [%0], 0, %1;" ::"l"(map), "r"(box_cols - less));
    asm volatile("tensormap.replace.tile.box_dim.global.b1024.b32 [%0], 1, %1;" ::"l"(map), "r"(box_rows - less));
    asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 0, %1;" ::"l"(map), "r"(cols - less));
    asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 1, %1;" ::"l"(map), "r"(rows - less));
    asm volatile("tensormap.replace.tile.global_stride.global.b1024.b64 [%0], 0, %1;" ::"l"(map), "l"(row_bytes));
    asm volatile("tensormap.replace.tile.element_stride.global.b1024.b32 [%0], 0, %1;" ::"l"(map), "r"(1 - less));
    asm volatile("tensormap.replace.tile.element_stride.global.b1024.b32 [%0], 1, %1;" ::"l"(map), "r"(1 - less));
    asm volatile("tensormap.replace.tile.elemtype.global.b1024.b32 [%0], %1;" ::"l"(map), "n"(ELEMTYPE));
    asm volatile("tensormap.replace.tile.interleave_layout.global.b1024.b32 [%0], 0;" ::"l"(map));
    asm volatile("tensormap.replace.tile.swizzle_mode.global.b1024.b32 [%0], 0;" ::"l"(map));
    asm volatile("tensormap.replace.tile.fill_mode.global.b1024.b32 [%0], 0;" ::"l"(map));
}

extern "C" __global__ void kf_probe_build(char* maps, const __nv_bfloat16* x, uint32_t rows, uint32_t cols,
                                          uint32_t box_rows, uint32_t box_cols) {
    if (threadIdx.x < VARIANTS) {
        // ptxas takes the element type as an immediate 0..12, the driver's enum's range (its BFLOAT16 is 9)
        const uint32_t less = threadIdx.x & 1;
        char* map = maps + 128 * threadIdx.x;
        if (threadIdx.x < 2) {
            replace_fields<9>(map, x, rows, cols, uint64_t(cols) * 2, box_rows, box_cols, less);
        } else {
            replace_fields<10>(map, x, rows, cols, uint64_t(cols) * 2, box_rows, box_cols, less);
        }
        asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
    }
}

// One box through `map` (a generic address of the map in global or param space) into `out`.
__device__ __forceinline__ void load_box(const void* map, __nv_bfloat16* out, int col0, int row0, int box_elements,
                                         bool acquire) {
    __shared__ alignas(128) __nv_bfloat16 box[64 * 64];
    __shared__ alignas(8) uint64_t barrier;
    const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&barrier));
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(box));
    if (threadIdx.x == 0) {
        if (acquire) {  // a map written in global memory by the device: its writes reach the tensormap proxy
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map) : "memory");
        }
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(box_elements * 2));
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
            ::"r"(dst), "l"(map), "r"(col0), "r"(row0), "r"(bar) : "memory");
        asm volatile(
            "{\n.reg .pred done;\nwait:\n"
            "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
            "@!done bra wait;\n}" ::"r"(bar) : "memory");
    }
    __syncthreads();
    for (int i = threadIdx.x; i < box_elements; i += blockDim.x) {
        out[i] = box[i];
    }
}

extern "C" __global__ void kf_probe_load(const char* map, __nv_bfloat16* out, int col0, int row0, int box_elements) {
    load_box(map, out, col0, row0, box_elements, true);
}

// The map passed by value, as the gemm_sm90 TMA template's harness passes its maps: a __grid_constant__ parameter,
// whose address the load takes. `through_local`: that address stored in local memory and read back first, as the
// template's Params (built on the device, in local memory) carry it to CUTLASS's producer.
struct alignas(64) Map {
    char bytes[128];
};
struct Holder {
    const Map* map;
};
extern "C" __global__ void kf_probe_load_param(const __grid_constant__ Map map, __nv_bfloat16* out, int col0, int row0,
                                               int box_elements, int through_local) {
    volatile Holder holder{&map};  // volatile: kept in local memory, not folded into the address
    const Map* address = through_local ? holder.map : &map;
    load_box(address, out, col0, row0, box_elements, false);
}
