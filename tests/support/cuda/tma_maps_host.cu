// A host program (trusted test code, never a candidate): includes a rendered gemm_sm90 TMA candidate, builds its
// mainloop's Params with CUTLASS's own host code (to_underlying_arguments -> make_tma_copy_{A,B}_sm90) and prints,
// one JSON line per map, what CUTLASS asks cuTensorMapEncodeTiled for. The driver call is this file's: it records its
// arguments and encodes nothing, so no GPU is needed. tests/proposers/templates/test_gemm_sm90_maps.py compares the
// lines with the maps the harness encodes from the template's plan. Built with -DKF_M=... -DKF_N=... -DKF_K=...
// -DKF_L=... and the candidate's directory on the include path.
#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1
#include <cstdio>
#include <cuda.h>

extern "C" CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType format, cuuint32_t rank, void*,
                                                   const cuuint64_t* dims, const cuuint64_t* strides,
                                                   const cuuint32_t* box, const cuuint32_t* element_strides,
                                                   CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                                   CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill) {
    auto list = [](const char* name, auto const* values, cuuint32_t count) {
        std::printf("\"%s\": [", name);
        for (cuuint32_t i = 0; i < count; ++i) {
            std::printf("%s%llu", i ? ", " : "", static_cast<unsigned long long>(values[i]));
        }
        std::printf("], ");
    };
    std::printf("{\"data_type\": %d, ", int(format));
    list("dims", dims, rank);
    list("strides", strides, rank - 1);
    list("box", box, rank);
    list("element_strides", element_strides, rank);
    std::printf("\"interleave\": %d, \"swizzle\": %d, \"l2_promotion\": %d, \"oob_fill\": %d}\n", int(interleave),
                int(swizzle), int(l2_promotion), int(oob_fill));
    return CUDA_SUCCESS;
}

#include "candidate.cu"

int main() {
    using Mainloop = kf::BuiltMainloop;
    const int M = KF_M, N = KF_N, K = KF_K, L = KF_L;
    Mainloop::Arguments args{};
#if A_ROW_MAJOR
    args.dA = cute::make_stride(int64_t(K), cute::Int<1>{}, int64_t(M) * K);
#else
    args.dA = cute::make_stride(cute::Int<1>{}, int64_t(M), int64_t(M) * K);
#endif
#if B_ROW_MAJOR
    args.dB = cute::make_stride(cute::Int<1>{}, int64_t(N), int64_t(N) * K);
#else
    args.dB = cute::make_stride(int64_t(K), cute::Int<1>{}, int64_t(N) * K);
#endif
    alignas(128) static kf::Element operands[2][64];  // any aligned addresses: nothing is read
    args.ptr_A = operands[0];
    args.ptr_B = operands[1];
    (void)Mainloop::to_underlying_arguments(cute::make_shape(M, N, K, L), args, nullptr);
    return 0;
}
