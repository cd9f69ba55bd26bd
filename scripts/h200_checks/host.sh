# host: the host time of one overridden eager call (issue 31's goal: eager's own + 2 us), through the compiled
# launcher, the Python path and eager, on the softmax run's package. About 60-90 s (the launcher's build ~15 s).
mkdir -p "$OUT/host"
timeout 150 python bench/cast_gpu.py --run examples/runs/softmax_bf16 --host-only --out "$OUT/host" \
  > "$OUT/host/log.txt" 2>&1
echo "rc=$?" >> "$OUT/host/log.txt"
