# tma: the gemm_sm90 TMA mainloop over harness-encoded tensor maps (issue 32).
# Needs the cubins built on the CPU machine first, and carried to the device:
#   python bench/gemm_cutlass.py build out/gemm_tma_cubins && rm -rf out/gemm_tma_cubins/cache   # the 6 seeds
#   (optional, the 8 further variants of scripts/h200_checks/tma_more.json:
#    python bench/gemm_cutlass.py build out/gemm_tma_more --variants scripts/h200_checks/tma_more.json && rm -rf out/gemm_tma_more/cache)
#   run(..., carry=["out/gemm_tma_cubins", "out/gemm_tma_more"])   (7 + 15 MiB)
# On the H100 (2026-12-07) one run of every seed aborted: "an illegal instruction was encountered", which kills the
# context and the rest of the run. So each configuration runs in a process of its own (`split`), every case of it:
# its error against an fp32 product of the same inputs (beside cuBLAS's) and its time against cuBLAS (L2 flushed,
# interleaved). Then memcheck over the first configuration that failed names its fault (each_config.sh). About
# 10-15 s a configuration (14 of them), memcheck 60 s.
mkdir -p "$OUT/tma"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/tma/env.txt" 2>&1
# 0. the maps' way in alone: the driver's map loaded by TMA from global memory, then by value as a __grid_constant__
# parameter (the template's way), its address read directly and through local memory (out/tma_probe.cubin, built
# here: nvcc -cubin -arch=sm_90a -O3 -o out/tma_probe.cubin bench/tma_probe.cu). ~10 s.
[ -f out/tma_probe.cubin ] && timeout 40 python bench/tma_probe.py out/tma_probe.cubin --out "$OUT/tma/probe" \
  > "$OUT/tma/probe.log" 2>&1
for set in gemm_tma_cubins gemm_tma_more; do
  [ -d "out/$set" ] && bash "$(dirname "$0")/each_config.sh" bench/gemm_cutlass.py "$set" "$OUT/tma"
done
[ -f "$OUT/tma/summary.txt" ] && cp "$OUT/tma/summary.txt" /tmp/tma_summary.txt  # for epilogue.sh, after run.sh has packed this part
