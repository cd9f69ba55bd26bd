# cards: convolution / baddbmm / attention cards captured on CUDA (issue 32). About 60-80 s of GPU time
# (each eval at most 20 s; six of them).
# 1. capture a small model on CUDA: conv2d NCHW bf16 (bias, stride 2), channels-last bf16 (groups, dilation),
#    fp32 conv2d (cuDNN's TF32), conv1d, baddbmm bf16 (beta/alpha), SDPA bf16 causal (flash), SDPA fp32 with
#    [b, s, h, d]-transposed q/k/v (memory-efficient?): the capture checks each card's CPU reference against
#    cuDNN's / the flash kernel's eager outputs (a refused card shows its reason in the table);
#    an nn.Linear on 2-D and 3-D inputs (variants.log: addmm and mm, no aten.linear);
# 2. `kernelforge eval` each card's own baseline.cu: proves the baseline against the stored eager outputs and fresh sets.
mkdir -p "$OUT/cards"
W=$(mktemp -d)
cat > "$W/vendor_gpu.py" <<'PY'
import torch
import torch.nn.functional as F
from torch import nn


class Vendor(nn.Module):
    def __init__(self):
        super().__init__()
        self.plain = nn.Conv2d(32, 48, 3, stride=2, padding=1)
        self.last = nn.Conv2d(32, 64, 3, padding=(1, 2), dilation=(1, 2), groups=2, bias=False).to(memory_format=torch.channels_last)
        self.line = nn.Conv1d(32, 40, 5, padding=2)
        self.wide = nn.Conv2d(32, 48, 3, padding=1).float()
        self.proj = nn.Linear(24, 40)  # F.linear: t + addmm (2-D) and view + mm (3-D), never aten.linear

    def forward(self, x, s, q, k, v, c, a, b):
        seq_first = lambda t: t.reshape(t.shape[0], t.shape[2], t.shape[1], t.shape[3]).transpose(1, 2)
        return (
            self.plain(x),
            self.last(x.contiguous(memory_format=torch.channels_last)),
            self.line(s),
            self.wide(x.float()),
            torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
            self.proj(c[0]),
            self.proj(c),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(*(seq_first(t).float() for t in (q, k, v)), scale=0.3),
        )


def build(device="cuda", dtype="bfloat16"):
    torch.manual_seed(0)
    t = getattr(torch, dtype)
    model = Vendor().to(device=device, dtype=t).eval()
    model.wide.float()
    make = lambda *shape: torch.randn(*shape, device=device, dtype=t)
    return model, (make(2, 32, 17, 15), make(2, 32, 45), make(2, 4, 37, 64), make(2, 4, 45, 64), make(2, 4, 45, 64),
                   make(4, 33, 24), make(4, 33, 40), make(4, 40, 24))
PY
timeout 60 kernelforge capture "$W/vendor_gpu.py" --device cuda -o "$W/v.capture" --repeats 2 > "$OUT/cards/capture.log" 2>&1
echo "capture rc $?" >> "$OUT/cards/capture.log"
COLUMNS=250 kernelforge capture --show "$W/v.capture" > "$OUT/cards/show.log" 2>&1
python - "$W/v.capture" > "$OUT/cards/variants.log" 2>&1 <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/capture.json"))
for v in m["variants"]:
    if v["status"] != "no-kernel":
        print(v["id"], v["op"], v["status"], v.get("card"), "|", v["reason"][:400], "|", v.get("estimate", "")[:200])
PY
for card in "$W"/v.capture/*/; do
  [ -f "$card/card.toml" ] || continue
  name=$(basename "$card")
  case "$name" in conv2d*|baddbmm*|attention*) ;; *) continue ;; esac  # conv1d: the conv2d kernel with h = 1
  python - "$card" > "$card/baseline.plan.toml" <<'PY'
import json, sys
from pathlib import Path
from kernelforge_tui.cards import load_card
plan = load_card(Path(sys.argv[1])).spec.baseline.plan
print(f"entry = {json.dumps(plan.entry)}\ngrid = {json.dumps(plan.grid)}\nblock = {json.dumps(plan.block)}\nargs = {json.dumps(plan.args)}")
PY
  timeout 20 kernelforge eval "$card" "$card/baseline.cu" --plan "$card/baseline.plan.toml" > "$OUT/cards/eval_$name.log" 2>&1
  echo "eval rc $?" >> "$OUT/cards/eval_$name.log"
done
