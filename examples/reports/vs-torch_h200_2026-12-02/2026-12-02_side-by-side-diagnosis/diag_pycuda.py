"""Phase C: the adopt and stream seeds in a pycuda context like the worker's, with the buffers laid out four ways."""
import os, subprocess, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
import numpy as np
import pycuda.driver as drv
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.cards.directory import load_card
from kernelforge_tui.proposers.templates import TemplateProposer

card = load_card(Path(sys.argv[1])); spec = card.spec
seeds = TemplateProposer().seeds(card)
picked = {"adopt": [s for s in seeds if s.params.get("strategy") == "adopt"][0],
          "stream": [s for s in seeds if s.params.get("strategy") == "stream"][0]}
inputs, refs = card.input_set(spec.input_sets[0])
drv.init(); ctx = drv.Device(0).make_context(); stream = drv.Stream()
GUARD = 64 * 1024; PAGE = 2 << 20
def layout(kind):
    bufs = {}
    for name, arr in list(inputs.items()) + [("y", np.zeros(spec.sizes["nrows"], np.float32))]:
        n = arr.nbytes
        size = n + 2 * GUARD if "guard" in kind else n
        if "round" in kind: size = -(-size // PAGE) * PAGE
        a = drv.mem_alloc(size); off = GUARD if "guard" in kind else 0
        drv.memcpy_htod(int(a) + off, np.ascontiguousarray(arr))
        bufs[name] = (a, int(a) + off)
    return bufs
fns = {}
for name, s in picked.items():
    p = f"/tmp/c_{name}.cu"; open(p, "w").write(s.source)
    subprocess.run(["nvcc", "-cubin", "-O3", "-lineinfo", "--std=c++17", "-arch=sm_90", p, "-o", p + ".cubin"], check=True)
    f = drv.module_from_file(p + ".cubin").get_function(s.plan.entry)
    rl = resolve(s.plan, spec)
    f.prepare("".join("P" if a.kind == "tensor" else "i" for a in rl.args))
    fns[name] = (f, rl)
scratch = drv.mem_alloc(256 << 20)
def timed(name, bufs, st, reps=30):
    f, rl = fns[name]
    vals = [np.uintp(bufs[a.name][1]) if a.kind == "tensor" else np.int32(a.value) for a in rl.args]
    go = lambda: f.prepared_async_call(rl.grid, rl.block, st, *vals, shared_size=rl.shared_bytes)
    for _ in range(3): go()
    ctx.synchronize(); ts = []
    while len(ts) < reps:
        ev = []
        for i in range(10):
            drv.memset_d32_async(scratch, i, (256 << 20) // 4, st)
            a, b = drv.Event(), drv.Event(); a.record(st); go(); b.record(st); ev.append((a, b))
        ctx.synchronize(); ts += [b.time_since(a) * 1000 for a, b in ev]
    out = np.empty(spec.sizes["nrows"], np.float32); drv.memcpy_dtoh(out, bufs["y"][1])
    err = np.max(np.abs(out - refs["y"]) / (np.abs(refs["y"]) + 1e-3))
    return float(np.median(ts)), err
layouts = {k: layout(k) for k in ("plain", "guard", "guard round", "plain round")}
for rnd in range(2):
    for k, bufs in layouts.items():
        for name in fns:
            for label, st in (("stream", stream), ("null", None)):
                t, e = timed(name, bufs, st)
                print(f"round {rnd} {t:7.1f} us  {name:6s} {k:12s} {label} err {e:.1e}", flush=True)
ctx.pop()
