# launcher_host: host time per call of the softmax_bf16 run exported with every check (~27 s), through eager,
# the compiled launcher and the Python path (~10 s). Times the host: run it alone, after launcher.sh.
mkdir -p "$OUT/launcher_host"
rm -rf /tmp/launcher_host
timeout 50 python bench/cast_gpu.py --run examples/runs/softmax_bf16 --host-only --out /tmp/launcher_host \
  > "$OUT/launcher_host/host.log" 2>&1
echo "bench rc=$?" >> "$OUT/launcher_host/host.log"
cp /tmp/launcher_host/cast_report.json /tmp/launcher_host/cast_report.md "$OUT/launcher_host/" 2>/dev/null
