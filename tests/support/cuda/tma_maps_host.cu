// A host program (trusted test code, never a candidate): includes rendered gemm_sm90 TMA candidates, builds each
// one's mainloop Params with CUTLASS's own host code (to_underlying_arguments -> make_tma_copy_{A,B}_sm90) and prints,
// one JSON line per map and a "--" line after each candidate, what CUTLASS asks cuTensorMapEncodeTiled for. The
// driver call is this file's: it records its arguments and encodes nothing, so no GPU is needed.
// tests/proposers/templates/test_gemm_sm90_maps.py compares the lines with the maps the harness encodes from the
// template's plan. One program for every case, since parsing CUTLASS is most of nvcc's time: the test writes the
// renders' #include lines to headers.cuh (included here, at global scope) and each render's body, up to its entry, to
// case_N.cu, which lands in its own namespace. Built with -DKF_CASES=n, with -DKF_M_N, -DKF_N_N, -DKF_K_N and
// -DKF_L_N for case N (the sizes), and with that directory on the include path. Each render's #defines follow the
// one before (the preprocessor warns of the redefinition): the values right after a case's include are its own.
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

#include "headers.cuh"

template <class Mainloop, bool a_row_major, bool b_row_major>
bool record_maps(int M, int N, int K, int L) {
    typename Mainloop::Arguments args{};
    if constexpr (a_row_major) {
        args.dA = cute::make_stride(int64_t(K), cute::Int<1>{}, int64_t(M) * K);
    } else {
        args.dA = cute::make_stride(cute::Int<1>{}, int64_t(M), int64_t(M) * K);
    }
    if constexpr (b_row_major) {
        args.dB = cute::make_stride(cute::Int<1>{}, int64_t(N), int64_t(N) * K);
    } else {
        args.dB = cute::make_stride(int64_t(K), cute::Int<1>{}, int64_t(N) * K);
    }
    using Element = cute::remove_cvref_t<decltype(*args.ptr_A)>;
    alignas(128) static Element operands[2][64];  // any aligned addresses: nothing is read
    args.ptr_A = operands[0];
    args.ptr_B = operands[1];
    (void)Mainloop::to_underlying_arguments(cute::make_shape(M, N, K, L), args, nullptr);
    std::printf("--\n");
    return true;
}

// Each case records its maps where it is defined: a translation unit's namespace-scope variables are initialised in
// the order they are defined, so the cases print in order, before main.

#if KF_CASES > 0
namespace case_0 {
#include "case_0.cu"
const bool recorded = record_maps<kf::BuiltMainloop, A_ROW_MAJOR, B_ROW_MAJOR>(KF_M_0, KF_N_0, KF_K_0, KF_L_0);
}  // namespace case_0
#endif
#if KF_CASES > 1
namespace case_1 {
#include "case_1.cu"
const bool recorded = record_maps<kf::BuiltMainloop, A_ROW_MAJOR, B_ROW_MAJOR>(KF_M_1, KF_N_1, KF_K_1, KF_L_1);
}  // namespace case_1
#endif
#if KF_CASES > 2
namespace case_2 {
#include "case_2.cu"
const bool recorded = record_maps<kf::BuiltMainloop, A_ROW_MAJOR, B_ROW_MAJOR>(KF_M_2, KF_N_2, KF_K_2, KF_L_2);
}  // namespace case_2
#endif
#if KF_CASES > 3
namespace case_3 {
#include "case_3.cu"
const bool recorded = record_maps<kf::BuiltMainloop, A_ROW_MAJOR, B_ROW_MAJOR>(KF_M_3, KF_N_3, KF_K_3, KF_L_3);
}  // namespace case_3
#endif
#if KF_CASES > 4
#error "at most four cases: add a block above"
#endif

int main() { return 0; }
