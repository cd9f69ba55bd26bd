# epilogue: issue 32's fused-epilogue goal, gemm_sm90's bias + GELU against cuBLAS then the separate GELU and against
# torch.compile(mode="max-autotune") of the same chain, at the decoder's gate shape (2048 x 5632 x 2048, bf16), on
# out/gemm_tma_cubins' linear_gelu case. Runs after tma in the same call: its summary, /tmp/tma_summary.txt, says which
# configurations ran without a fault.
# About 2-4 min: Inductor's autotuning of the chain, then the interleaved timing.
mkdir -p "$OUT/epilogue"
python - /tmp/tma_summary.txt > "$OUT/epilogue/chosen.txt" 2>&1 <<'PY'
import json, sys
from pathlib import Path
summary = Path(sys.argv[1])
ran = {line.split(" rc=0 ", 1)[1].split(" | ")[0] for line in summary.read_text().splitlines() if " rc=0 " in line} \
    if summary.exists() else set()
built = json.loads(Path("out/gemm_tma_cubins/manifest.json").read_text())
variants = [v for v in built["variants"] if v["case"] == "linear_gelu" and (v["config"] in ran or "cp_async" in v["config"])]
folder = Path("/tmp/epilogue_cubins")
folder.mkdir(exist_ok=True)
for v in variants:
    (folder / v["cubin"]).write_bytes(Path("out/gemm_tma_cubins", v["cubin"]).read_bytes())
cases = [c for c in built["cases"] if c["name"] == "linear_gelu"]
(folder / "manifest.json").write_text(json.dumps({**built, "cases": cases, "variants": variants}))
print("\n".join(v["config"] for v in variants))
PY
timeout 400 python bench/gemm_cutlass.py run /tmp/epilogue_cubins --out "$OUT/epilogue" --max-autotune \
  > "$OUT/epilogue/log.txt" 2>&1
echo "rc=$?" >> "$OUT/epilogue/log.txt"
