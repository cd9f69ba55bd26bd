# chains (issue 31): the chain templates' kernels through the GPU worker's checks on the H200 (every seed, every
# set, fp32 and bf16): the two-output residual_sum_* norms (chain_rows version 2, with residual_layer_norm bf16 as
# its regression), and the new batch_norm_relu / batch_norm_add_relu (NCHW and channels-last). Then which chains a CUDA
# capture of the zoo models finds (small sizes; what eager CUDA records may differ from the CPU: cudnn_batch_norm,
# _fused_rms_norm). At most 145 s: pytest 100 s (13 cases), each capture 15 s.
mkdir -p "$OUT/chains"
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/proposers/templates/test_chains.py \
  -k "on_the_gpu and (residual_sum or batch_norm or residual_layer_norm-bfloat16)" > "$OUT/chains/pytest.log" 2>&1
echo "rc=$?" >> "$OUT/chains/pytest.log"
KF="python -m kernelforge_tui.cli.main"
command -v kernelforge >/dev/null && KF=kernelforge
for m in resnet50 llama vit; do
  timeout 15 $KF capture bench/zoo_models.py --entry $m --device cuda --kwarg size=small --repeats 1 --samples 1 \
    -o "/tmp/chains_gpu/$m.capture" --force > "$OUT/chains/capture_$m.log" 2>&1
  python - "/tmp/chains_gpu/$m.capture" >> "$OUT/chains/chains_$m.txt" 2>&1 <<'PY'
import sys
from pathlib import Path
from kernelforge_tui.capture import load_capture
m = load_capture(Path(sys.argv[1]))
for v in m.variants:
    if v.kind == "pattern":
        print(v.op, v.calls, v.status, v.card, " -> ".join(s.op for s in v.steps))
bn = sorted({v.steps[0].op for v in m.variants if v.kind == "op" and "norm" in v.steps[0].op})
print("norm ops seen:", bn)
PY
done
