// Experiment: group_norm with TMA bulk loads into shared memory, statistics through a cluster, optional TMA stores,
// optional persistent ring of STAGES slices. bf16, stats outputs. Macros: S, BLOCK, STAGES, TMA_STORE, STCS, MINB.
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <stdint.h>
#ifndef ILP
#define ILP 0
#endif
#ifndef SPLITSYNC
#define SPLITSYNC 0
#endif
#ifndef KEEP_CHUNKS
#define KEEP_CHUNKS 0
#endif
#ifndef PREFETCH
#define PREFETCH 0
#endif
#ifndef ONEPASS
#define ONEPASS 0
#endif
#ifndef NCOPY
#define NCOPY 1
#endif
#ifndef PROBE
#define PROBE 0
#endif
namespace cg = cooperative_groups;
typedef __nv_bfloat16 T;
struct __align__(16) V8 { T v[8]; };

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n .reg .pred p;\n W_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W_%=;\n}\n" ::"r"(
          sa(bar)),
      "r"(phase)
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa(dst)),
               "l"(src), "r"(bytes), "r"(sa(bar))
               : "memory");
}
__device__ __forceinline__ void tma_store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(sa(src)), "r"(bytes)
               : "memory");
}

struct F2 { float a, b; };
__device__ __forceinline__ F2 block_sum(F2 v, F2* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { v.a += __shfl_xor_sync(0xffffffffu, v.a, o); v.b += __shfl_xor_sync(0xffffffffu, v.b, o); }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  F2 t = {0.f, 0.f};
#pragma unroll
  for (int w = 0; w < BLOCK / 32; ++w) { t.a += red[w].a; t.b += red[w].b; }
  __syncthreads();
  return t;
}
__device__ __forceinline__ F2 cluster_sum(F2 v, F2* red, F2* part, cg::cluster_group& cl) {
  v = block_sum(v, red);
  if (threadIdx.x == 0) *part = v;
  cl.sync();
  F2 t = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < S; ++r) { const F2 p = *cl.map_shared_rank(part, r); t.a += p.a; t.b += p.b; }
#if !SPLITSYNC
  cl.sync();
#endif
  return t;
}

extern "C" __global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(BLOCK, MINB) gn_tma(
    const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta, T* __restrict__ y,
    T* __restrict__ mean_out, T* __restrict__ rstd_out, int c, int hw, int groups, int total, unsigned long long* probe) {
#define STAMP(k) do { if (PROBE && threadIdx.x == 0 && it < 2) { unsigned long long t_; if ((k) == 0 || (k) == 6) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); else t_ = clock64(); probe[((long long)blockIdx.x * 2 + it) * 8 + (k)] = t_; } } while (0)
  extern __shared__ __align__(128) unsigned char raw[];
  V8* buf = reinterpret_cast<V8*>(raw);
  __shared__ __align__(8) uint64_t bar[STAGES * NCOPY];
  __shared__ F2 red[32];
  __shared__ F2 parts[2];
  cg::cluster_group cl = cg::this_cluster();
  const int rank = (int)cl.block_rank();
  const int cpg = c / groups;
  const long long len = (long long)cpg * hw;
  const int chunks = (int)(len / 8 / S);
  const int kept = (KEEP_CHUNKS > 0 && KEEP_CHUNKS < chunks) ? KEEP_CHUNKS : chunks;  // the rest is read from global
  const uint32_t bytes = (uint32_t)kept * 16u;
  const long long nclusters = gridDim.x / S;
  const long long g0 = blockIdx.x / S;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES * NCOPY; ++s) mbar_init(&bar[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      const long long g = g0 + s * nclusters;
      if (g < total) {
        for (int k = 0; k < NCOPY; ++k) {
          const int c0 = kept * k / NCOPY, c1 = kept * (k + 1) / NCOPY;
          mbar_expect_tx(&bar[s * NCOPY + k], (uint32_t)(c1 - c0) * 16u);
          tma_load(buf + s * kept + c0, x + g * len + (long long)rank * chunks * 8 + c0 * 8, (uint32_t)(c1 - c0) * 16u, &bar[s * NCOPY + k]);
        }
      }
    }
  }
  int it = 0;
  STAMP(0); STAMP(7);
  for (long long g = g0; g < total; g += nclusters, ++it) {
    const int s = it % STAGES;
    V8* sl = buf + s * kept;
    const V8* gsl = reinterpret_cast<const V8*>(x + g * len + (long long)rank * chunks * 8);
    const float pivot = __bfloat162float(x[g * len]);
#if PREFETCH
    for (int l = threadIdx.x; l < (chunks - kept + 7) / 8; l += BLOCK) {  // the tail's 128-byte lines, into L2
      asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(gsl + kept + l * 8));
    }
#endif
    STAMP(1);
    F2 acc = {0.f, 0.f};
    for (int k = 0; k < NCOPY; ++k) {
      const int c0 = kept * k / NCOPY, c1 = (k == NCOPY - 1) ? chunks : kept * (k + 1) / NCOPY;
      mbar_wait(&bar[s * NCOPY + k], (uint32_t)((it / STAGES) & 1));
      if (k == 0) STAMP(2);
      for (int i = c0 + threadIdx.x; i < c1; i += BLOCK) {
        V8 v;
        if (i < kept) v = sl[i]; else *reinterpret_cast<int4*>(&v) = __ldg(reinterpret_cast<const int4*>(gsl) + i);
#pragma unroll
        for (int j = 0; j < 8; ++j) { const float d = __bfloat162float(v.v[j]) - pivot; acc.a += d; acc.b += ONEPASS ? d * d : d + pivot; }
      }
    }
    const F2 sums = cluster_sum(acc, red, &parts[0], cl);
    STAMP(3);
    const float mean = pivot + sums.a / (float)len;
    float rstd;
    const float md = sums.a / (float)len, var1 = sums.b / (float)len - md * md;
    if (ONEPASS && md * md <= 64.f * var1) {
      rstd = rsqrtf(var1 + 1e-5f);
    } else {
    F2 q = {0.f, 0.f};
    for (int i = threadIdx.x; i < chunks; i += BLOCK) {
      V8 v;
      if (i < kept) v = sl[i]; else *reinterpret_cast<int4*>(&v) = __ldg(reinterpret_cast<const int4*>(gsl) + i);
#pragma unroll
#if !ILP
      for (int j = 0; j < 8; ++j) { const float d = __bfloat162float(v.v[j]) - mean; q.a += d * d; }
#else
      float d[8];
      for (int j = 0; j < 8; ++j) { d[j] = __bfloat162float(v.v[j]) - mean; d[j] *= d[j]; }
      q.a += ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
#endif
    }
    rstd = rsqrtf(cluster_sum(q, red, &parts[1], cl).a / (float)len + 1e-5f);
    }
#if SPLITSYNC
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");  // our parts may go once every block has read them
#endif
    STAMP(4);
    if (rank == 0 && threadIdx.x == 0) { mean_out[g] = __float2bfloat16_rn(ONEPASS ? mean : sums.b / (float)len); rstd_out[g] = __float2bfloat16_rn(rstd); }
    const int c0 = (int)(g % groups) * cpg;
    const int first = rank * chunks * 8;
    T* yg = y + g * len + first;
    for (int i = threadIdx.x; i < chunks; i += BLOCK) {
      const int ch = c0 + (first + i * 8) / hw;
      const float ga = __bfloat162float(gamma[ch]) * rstd, be = __bfloat162float(beta[ch]);
      V8 v;
      if (i < kept) v = sl[i]; else *reinterpret_cast<int4*>(&v) = __ldg(reinterpret_cast<const int4*>(gsl) + i);
#pragma unroll
      for (int j = 0; j < 8; ++j) v.v[j] = __float2bfloat16_rn(fmaf(__bfloat162float(v.v[j]) - mean, ga, be));
#if TMA_STORE
      sl[i] = v;
#elif STCS
      __stcs(reinterpret_cast<int4*>(yg) + i, *reinterpret_cast<int4*>(&v));
#else
      reinterpret_cast<V8*>(yg)[i] = v;
#endif
    }
    STAMP(5);
#if TMA_STORE
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
      tma_store(yg, sl, bytes);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      // refill the previous iteration's stage once its store has read it
      if (STAGES == 1) {
        const long long gn = g + nclusters;
        if (gn < total) {
          asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
          mbar_expect_tx(&bar[0], bytes);
          tma_load(buf, x + gn * len + (long long)rank * chunks * 8, bytes, &bar[0]);
        }
      } else if (it >= 1) {
        const long long gn = g + (STAGES - 1) * nclusters;
        if (STAGES > 1 && gn < total) {
          asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
          const int ps = (it - 1) % STAGES;
          mbar_expect_tx(&bar[ps], bytes);
          tma_load(buf + ps * kept, x + gn * len + (long long)rank * chunks * 8, bytes, &bar[ps]);
        }
      }
    }
#else
    __syncthreads();
    if (threadIdx.x == 0) {
      const long long gn = g + STAGES * nclusters;
      if (gn < total) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        for (int k = 0; k < NCOPY; ++k) {
          const int c0 = kept * k / NCOPY, c1 = kept * (k + 1) / NCOPY;
          mbar_expect_tx(&bar[s * NCOPY + k], (uint32_t)(c1 - c0) * 16u);
          tma_load(sl + c0, x + gn * len + (long long)rank * chunks * 8 + c0 * 8, (uint32_t)(c1 - c0) * 16u, &bar[s * NCOPY + k]);
        }
      }
    }
#endif
  }
#if TMA_STORE
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
  it = 0; STAMP(6);
#if SPLITSYNC
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}
