# audit: a real package with calls per forward (format 3) on the H200, and the one per-kernel line in export's
# output, export --json, and `kernelforge run`'s end report (eager forwards, then torch.compile(backend="kernelforge")).
# About 100 s: capture 6 s, search of the decoder's 3 best cards 20 s, export with every check 45 s, run 20 s.
mkdir -p "$OUT/audit"
W=/tmp/audit_gpu
rm -rf "$W" && mkdir -p "$W"
KF="python -m kernelforge_tui.cli.main"
command -v kernelforge >/dev/null && KF=kernelforge
$KF capture examples/models/decoder_block.py --device cuda --repeats 2 --samples 1 --max-set-mib 1 \
  -o "$W/decoder.capture" --force > "$OUT/audit/capture.log" 2>&1
KERNELFORGE_PROFILE__NEW_BEST=false KERNELFORGE_PROFILE__BEATS_PARENT=false \
  $KF optimize "$W/decoder.capture" --top 3 --budget-iters 24 --root "$W/decoder.capture/runs" > "$OUT/audit/optimize.log" 2>&1
COLUMNS=400 $KF export "$W/decoder.capture" -o "$W/decoder.cast" > "$OUT/audit/export.txt" 2>&1
echo "export rc=$?" >> "$OUT/audit/export.txt"
python - "$W/decoder.cast" > "$OUT/audit/manifest_kernels.json" 2>&1 <<'PY'
import json, sys
from kernelforge_tui.cast.manifest import read_package
m = read_package(sys.argv[1]).manifest
print(json.dumps({"format_version": m.format_version, "kernels": [
    {"id": k.id, "per_forward": k.per_forward and k.per_forward.model_dump(), "serves": k.serves,
     "saved_per_call_us": k.saved_per_call_us, "saved_per_forward_us": k.saved_per_forward_us} for k in m.kernels]}, indent=1))
PY
cat > "$W/forwards.py" <<'PY'
import sys
import torch
sys.path.insert(0, "examples/models")
from decoder_block import build
model, inputs = build(device="cuda")
with torch.no_grad():
    for _ in range(10):
        model(*inputs)
    compiled = torch.compile(model, backend="kernelforge")
    for _ in range(10):
        compiled(*inputs)
torch.cuda.synchronize()
print("20 forwards: 10 eager, 10 compiled")
PY
COLUMNS=400 $KF run "$W/decoder.cast" "$W/forwards.py" > "$OUT/audit/run.txt" 2>&1
echo "run rc=$?" >> "$OUT/audit/run.txt"
python -m pytest -q -p no:cacheprovider tests/cast/test_per_forward.py > "$OUT/audit/cpu_tests.log" 2>&1
