#!/usr/bin/env bash
# Capture the Nsight Compute CSV fixtures on the GPU machine (an H200, sm_90).
#
# For each fixture card (tests/support/fixtures/ncu/cards/NAME, whose baseline.cu and baseline.plan.toml are a streaming
# copy, a latency-bound pointer chase, an FMA chain) it builds the cubin with nvcc, checks that ncu.launch
# launches it, then runs the exact ncu command line the Profiler uses (asked from kernelforge_tui.gpu.ncu.run
# --print-command) and writes
#   $OUT/<name>.csv           the raw-page CSV (the fixture, copy to tests/support/fixtures/ncu/)
#   $OUT/<name>.details.csv   the same profile as the details page (labels and sections, for reference)
#   $OUT/<name>.report.json   the Profiler run end to end (typed metrics, overhead in .seconds)
#   $OUT/<name>.analysis.txt  `kernelforge profile CARD KERNEL` (class, key metrics, roofline), when present
#   $OUT/timings.txt          wall seconds of each ncu run: the overhead of profiling one candidate
# plus ncu's version, nvidia-smi and the metric names this ncu knows (to check config.NCU_RAW_METRICS against).
#
# Usage (repository root, PYTHONPATH=/tmp/site:$PWD as set up for the GPU machine):
#   OUT=/some/dir scripts/capture_ncu_fixtures.sh
# It keeps going when one step fails; look at the *.stderr.txt files.
set -x
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out/ncu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
FIX=tests/support/fixtures/ncu
BUILD=$(mktemp -d)

ncu --version > "$OUT/ncu_version.txt" 2>&1
cat "$OUT/ncu_version.txt"
nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1
nvcc --version > "$OUT/nvcc_version.txt" 2>&1
ncu --query-metrics --csv > "$OUT/query_metrics.csv" 2> "$OUT/query_metrics.stderr.txt" \
  || ncu --query-metrics > "$OUT/query_metrics.txt" 2>&1
: > "$OUT/timings.txt"

for name in stream_copy uncoalesced fma_chain; do
  card=$FIX/cards/$name
  kernel=$card/baseline.cu
  plan=$card/baseline.plan.toml
  cubin=$BUILD/$name.cubin
  if ! nvcc -cubin -O3 -lineinfo -arch=sm_90 -Xptxas -v -o "$cubin" "$kernel" > "$OUT/$name.ptxas.txt" 2>&1; then
    echo "BUILD FAILED: $name" | tee -a "$OUT/timings.txt"
    continue
  fi
  # 1. the launcher alone (no profiler): it must launch cleanly
  start=$(date +%s.%N)
  $PY -m kernelforge_tui.gpu.ncu.launch "$card" "$cubin" --plan "$plan" > "$OUT/$name.launch.txt" 2>&1
  echo "$name launch_only rc=$? seconds=$(echo "$(date +%s.%N) - $start" | bc)" | tee -a "$OUT/timings.txt"

  # 2. the exact ncu command line of the Profiler
  mapfile -t CMD < <($PY -m kernelforge_tui.gpu.ncu.run "$card" "$cubin" --plan "$plan" --print-command)
  printf '%q ' "${CMD[@]}" > "$OUT/$name.command.txt"
  start=$(date +%s.%N)
  "${CMD[@]}" > "$OUT/$name.csv" 2> "$OUT/$name.stderr.txt"
  echo "$name ncu_raw rc=$? seconds=$(echo "$(date +%s.%N) - $start" | bc)" | tee -a "$OUT/timings.txt"

  # 3. the same profile as the details page (section labels), for reference
  DETAILS=()
  for arg in "${CMD[@]}"; do
    if [ "$arg" = raw ]; then DETAILS+=(details); else DETAILS+=("$arg"); fi
  done
  "${DETAILS[@]}" > "$OUT/$name.details.csv" 2> "$OUT/$name.details.stderr.txt"
  echo "$name ncu_details rc=$?" | tee -a "$OUT/timings.txt"

  # 4. the Profiler end to end (parsing included); its .seconds is the profiling overhead
  start=$(date +%s.%N)
  $PY -m kernelforge_tui.gpu.ncu.run "$card" "$cubin" --plan "$plan" > "$OUT/$name.report.json" 2> "$OUT/$name.report.stderr.txt"
  echo "$name profiler rc=$? seconds=$(echo "$(date +%s.%N) - $start" | bc)" | tee -a "$OUT/timings.txt"

  # 5. classification and roofline through the CLI, where this checkout has it
  if $PY -m kernelforge_tui.cli profile --help > /dev/null 2>&1; then
    $PY -m kernelforge_tui.cli profile "$card" "$kernel" --plan "$plan" > "$OUT/$name.analysis.txt" 2>&1
    echo "$name cli_profile rc=$?" | tee -a "$OUT/timings.txt"
  fi
  head -c 600 "$OUT/$name.csv"; echo
done
rm -rf "$BUILD"
cat "$OUT/timings.txt"
ls -la "$OUT"
