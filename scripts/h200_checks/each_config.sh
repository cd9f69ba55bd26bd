# each_config.sh BENCH SET OUT: every configuration of out/SET (built by BENCH's `build`) run by BENCH's `run` in a
# process of its own (`split`: a kernel that faults kills its process's CUDA context, and the rest of that run with
# it), each into OUT/SET/<n>/, a line per configuration in OUT/summary.txt; then memcheck over the first that
# failed (OUT/memcheck_head.log). Sourced by tma.sh and conv.sh; about 10-15 s a configuration, memcheck 60 s.
bench=$1 set=$2 out=$3
failed=""
for one in $(python "$bench" split "out/$set" --out "/tmp/split/$set"); do
  name="$set/$(basename "$one")"
  mkdir -p "$out/$name"
  timeout 40 python "$bench" run "$one" --out "$out/$name" > "$out/$name/log.txt" 2>&1
  rc=$?
  config=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['variants'][0]['config'])" "$one/manifest.json")
  echo "$name rc=$rc $config | $(grep -m1 -o 'CUDA error[^|]*\|illegal[^|]*\|Error[^|]*' "$out/$name/log.txt" | head -c 200)" \
    >> "$out/summary.txt"
  [ "$rc" != 0 ] && [ -z "$failed" ] && failed="$one"
done
if [ -n "$failed" ]; then
  echo "memcheck over $failed" >> "$out/memcheck_head.log"
  timeout 90 compute-sanitizer --tool memcheck --print-limit 5 python "$bench" run "$failed" --out /tmp/memcheck 2>&1 \
    | head -c 20000 >> "$out/memcheck_head.log"
fi
