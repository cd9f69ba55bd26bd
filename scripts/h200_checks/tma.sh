# tma: the gemm_sm90 TMA mainloop over harness-encoded tensor maps (issue 32). Not yet run: no device this session.
# Needs the cubins built on the CPU machine first (~10-15 min of nvcc on 2 cores), and carried to the device:
#   python bench/gemm_cutlass.py build out/gemm_tma_cubins && rm -rf out/gemm_tma_cubins/cache   # the 6 seeds
#   (optional, the 8 further variants of scripts/h200_checks/tma_more.json:
#    python bench/gemm_cutlass.py build out/gemm_tma_more --variants scripts/h200_checks/tma_more.json && rm -rf out/gemm_tma_more/cache)
#   run(..., carry=["out/gemm_tma_cubins", "out/gemm_tma_more"])   (7 + 9 MiB)
# Both folders are built as of commit f58ac24 in out/ of the lead checkout (ignored by git).
# About 130-160 s of GPU time:
# 1. bench/gemm_cutlass.py run: every seed (TMA 1x1 / 2x1 / 1x2 clusters, pingpong, and the cp.async best) at the
#    decoder's shapes: each one's error against an fp32 product of the same inputs (beside cuBLAS's), and its time
#    against cuBLAS (L2 flushed, interleaved). ~50 s; the further variants another ~50 s if carried.
# 2. the further variants (out/gemm_tma_more), if carried. The product-path GPU tests are tma_tests.sh.
# On the H100 (2026-12-07) the run aborted: "an illegal instruction was encountered", which kills the context (the
# log's head did not come back). 0. first, memcheck over the run names the faulting kernel and its error (~60 s).
mkdir -p "$OUT/tma"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/tma/env.txt" 2>&1
timeout 90 compute-sanitizer --tool memcheck --print-limit 5 python bench/gemm_cutlass.py run out/gemm_tma_cubins \
  --out /tmp/tma_memcheck > "$OUT/tma/memcheck.log" 2>&1
head -c 20000 "$OUT/tma/memcheck.log" > "$OUT/tma/memcheck_head.log" && rm "$OUT/tma/memcheck.log"
timeout 100 python bench/gemm_cutlass.py run out/gemm_tma_cubins --out "$OUT/tma" > "$OUT/tma/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/tma/bench.log"
if [ -d out/gemm_tma_more ]; then
  mkdir -p "$OUT/tma/more"
  timeout 100 python bench/gemm_cutlass.py run out/gemm_tma_more --out "$OUT/tma/more" > "$OUT/tma/more/bench.log" 2>&1
  echo "bench rc=$?" >> "$OUT/tma/more/bench.log"
fi
