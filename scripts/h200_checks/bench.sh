# compile_path: the three example blocks and the three models we did not write (bench/zoo_models.py), each
# captured, its 3 best cards searched, exported with every check, then timed in every mode (issue 31's table).
# About 150-250 s a block; resumable: a block whose OUT/compile/<block>.json exists is skipped, so carry the folder
# of an earlier call's OUT back in (as out/compile) to go on. BLOCKS picks which (default: all six); MAX_AUTOTUNE=1
# adds compile(mode="max-autotune") with and without the package (issue 31 asks to beat the best compile mode;
# minutes of autotuning a block, so a block a call).
mkdir -p "$OUT/compile"
[ -d out/compile ] && cp -n out/compile/*.json "$OUT/compile/" 2>/dev/null
python bench/compile_path.py --out "$OUT/compile" --work /tmp/compile_path --blocks ${BLOCKS:-decoder diffusion resnet_block llama vit resnet50} \
  --top 3 --iters 12 --rounds 5 ${MAX_AUTOTUNE:+--max-autotune} > "$OUT/compile/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/compile/bench.log"
