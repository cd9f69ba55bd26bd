"""Phase B: in one torch+cupy process, cuSPARSE (the vendor's call, A@x, A@x[:,None]) and the adopt seed under the
vendor's and the evaluator's timing differences: flush value, prefill of y, interleaving with the baseline."""
import os, subprocess, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
import numpy as np, cupy as cp, torch
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.cards.directory import load_card
from kernelforge_tui.config import EvalSettings
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.suite import vendor_timing as vt

card = load_card(Path(sys.argv[1]))
spec = card.spec
seeds = TemplateProposer().seeds(card)
adopt = [s for s in seeds if s.params.get("strategy") == "adopt"][0]
stream = [s for s in seeds if s.params.get("strategy") == "stream"][0]
def build(src, entry, name):
    p = f"/tmp/{name}.cu"; open(p, "w").write(src)
    subprocess.run(["nvcc", "-cubin", "-O3", "-lineinfo", "-arch=sm_90", p, "-o", p + ".cubin"], check=True)
    return cp.RawModule(path=p + ".cubin").get_function(entry)
inputs, refs = card.input_set(spec.input_sets[0])
print("drawn", {k: v.shape for k, v in inputs.items()}, flush=True)
t = {k: vt.to_torch(torch, v, "cuda") for k, v in inputs.items()}
sizes = dict(spec.sizes); nrows = sizes["nrows"]
y = torch.empty(nrows, device="cuda", dtype=torch.float32)
noise = torch.randn(nrows, device="cuda", dtype=torch.float32)
ptr = lambda a: np.uint64(a.data_ptr())
def launcher(fn, plan):
    rl = resolve(plan, spec)
    args = {"values": t["values"], "col_idx": t["col_idx"], "row_ptr": t["row_ptr"], "x": t["x"], "y": y}
    vals = [ptr(args[a.name]) if a.kind == "tensor" else getattr(np, a.scalar_type if a.scalar_type != "float" else "float32")(a.value) for a in rl.args]
    return lambda: fn(rl.grid, rl.block, tuple(vals), shared_mem=rl.shared_bytes)
def try_launcher(seed, name):
    fn = build(seed.source, seed.plan.entry, name)
    return launcher(fn, seed.plan)
ours = try_launcher(adopt, "adopt")
def shifted(a):
    b = torch.empty(a.numel() + 16384 * 2, dtype=a.dtype, device="cuda")[16384:16384 + a.numel()]
    b.copy_(a); return b
t_plain = dict(t); t = {k: shifted(v) for k, v in t_plain.items()}; y_plain = y; y = shifted(y)
ours_shifted = try_launcher(adopt, "adopt_s"); t = t_plain; y = y_plain; ours_stream = try_launcher(stream, "stream")
bfn = build(card.baseline_source(), spec.baseline.plan.entry, "baseline")
base = launcher(bfn, spec.baseline.plan)
ref = torch.from_numpy(np.asarray(refs["y"])).cuda()
for name, f in (("adopt", ours), ("stream", ours_stream), ("baseline", base)):
    y.fill_(float("nan")); f(); torch.cuda.synchronize()
    print(name, "err", (((y - ref).abs()) / (ref.abs() + 1e-3)).max().item(), flush=True)
A = torch.sparse_csr_tensor(t["row_ptr"], t["col_idx"], t["values"], (nrows, sizes["ncols"]), check_invariants=False)
x = t["x"]
vendor_call = lambda: card_vendor()
from kernelforge_tui.suite.registry import task as st
tk = vt.task_of(card)
card_vendor = lambda: tk.vendor.run(torch, t, sizes)
flush_bytes = EvalSettings().flush_bytes
scratch = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda")
def timed(f, reps=30, zero=False, prefill=False, partner=None):
    samples = []
    for i in range(3): f()
    torch.cuda.synchronize()
    while len(samples) < reps:
        evs = []
        for i in range(10):
            if partner is not None:
                scratch.fill_(i); partner()
            if prefill: y.copy_(noise)
            scratch.fill_(0 if zero else i)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); f(); b.record(); evs.append((a, b))
        torch.cuda.synchronize()
        samples += [a.elapsed_time(b) * 1000 for a, b in evs]
    return float(np.median(samples))
if os.environ.get("ONCE"):
    for f in (ours, lambda: A @ x):
        scratch.fill_(1); f(); torch.cuda.synchronize()
    sys.exit(0)
req = vt.VendorRequest(card_dir=card.root, reps=30)
cases = [
    ("vendor time_calls (the bench's way)", lambda: float(np.median(vt.time_calls(torch, card_vendor, req)))),
    ("cuSPARSE A@x fill(i)", lambda: timed(lambda: A @ x)),
    ("cuSPARSE A@x[:,None] fill(i)", lambda: timed(lambda: A @ x.unsqueeze(1))),
    ("cuSPARSE A@x fill(0)", lambda: timed(lambda: A @ x, zero=True)),
    ("adopt fill(i)", lambda: timed(ours)),
    ("adopt fill(0)", lambda: timed(ours, zero=True)),
    ("adopt on buffers 64 KB past 2 MB", lambda: timed(ours_shifted)),
    ("adopt prefill y", lambda: timed(ours, prefill=True)),
    ("adopt after baseline", lambda: timed(ours, partner=base)),
    ("cuSPARSE A@x after baseline", lambda: timed(lambda: A @ x, partner=base)),
    ("stream fill(i)", lambda: timed(ours_stream)),
]
for rnd in range(3):
    for name, c in cases:
        print(f"round {rnd} {c():7.1f} us  {name}", flush=True)
