# compile_path: the three example blocks and the three models we did not write (bench/zoo_models.py), each
# captured, its 3 best cards searched, exported with every check, then timed in every mode (issue 31's table).
# About 110-250 s a block (H100, 2026-12-07); resumable: a block whose JSON is there without an error is skipped, so
# unpack an earlier call's parts.tar and carry its bench/compile folder back in as out/compile to go on. BLOCKS picks which (default: all six); MAX_AUTOTUNE=1
# adds compile(mode="max-autotune") with and without the package (issue 31 asks to beat the best compile mode;
# minutes of autotuning a block, so a block a call).
mkdir -p "$OUT/bench/compile"
[ -d out/compile ] && cp -n out/compile/*.json "$OUT/bench/compile/" 2>/dev/null
python bench/compile_path.py --out "$OUT/bench/compile" --work /tmp/compile_path --blocks ${BLOCKS:-decoder diffusion resnet_block llama vit resnet50} \
  --top 3 --iters 12 --rounds 5 ${MAX_AUTOTUNE:+--max-autotune} > "$OUT/bench/compile/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench/compile/bench.log"
