// Experiment: cache-hinted loads for CSR SpMV.
__device__ __forceinline__ int4 once_na(const int4* p) { int4 r; asm("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x),"=r"(r.y),"=r"(r.z),"=r"(r.w) : "l"(p)); return r; }
__device__ __forceinline__ int4 once_ef(const int4* p) { int4 r; asm("{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n ld.global.nc.L1::no_allocate.L2::cache_hint.v4.s32 {%0,%1,%2,%3}, [%4], pol;\n}" : "=r"(r.x),"=r"(r.y),"=r"(r.z),"=r"(r.w) : "l"(p)); return r; }
__device__ __forceinline__ float gather_el(const float* p) { float r; asm("ld.global.nc.L1::evict_last.f32 %0, [%1];" : "=f"(r) : "l"(p)); return r; }
