"""Experiment: the best CSR SpMV kernel of the template (stream) and cuSPARSE on the suite's 2^22-row fp32 card,
each launched once (for ncu), and timed side by side (CUDA events, L2 flushed, median)."""
import os, subprocess, sys, time
import numpy as np, cupy as cp, torch
sys.path.insert(0, os.getcwd())
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates.sparse import SparseTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
tk = task("spmv_csr")
spec = cards.spec(tk, "float32", 2**26, beyond=True)
t0 = time.time(); d = tk.draw(spec.sizes, "float32", 1); print("drawn in", round(time.time() - t0, 1), "s", spec.sizes, flush=True)
tpl = SparseTemplate()
base = {"strategy": "stream", "tpr": 1, "rpb": 512, "unroll": 1, "block": 1024, "items": 8, "vec": 4, "hint": "stream", "minb": 2, "cluster": 2}
variants = {"stream": base}
for extra in sys.argv[1:]:
    k, v = extra.split("=")
    variants[extra] = {**base, k: int(v) if v.isdigit() else v}
dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
values, col, rowp, x = dev(d["values"]), dev(d["col_idx"]), dev(d["row_ptr"]), dev(d["x"])
nrows = spec.sizes["nrows"]
L = np.diff(d["row_ptr"].astype(np.int64)); print("rows: max", L.max(), "mean", L.mean(), "empty", (L == 0).sum(), "ncols", x.numel(), flush=True)
y = torch.empty(nrows, device="cuda", dtype=torch.float32)
A = torch.sparse_csr_tensor(rowp, col, values, size=(nrows, x.numel()))
ref = (A @ x.unsqueeze(1)).squeeze(1)
flush = cp.empty(256 << 20, dtype=cp.uint8)
ptr = lambda t: np.uint64(t.data_ptr())
def timeit(f, reps=25):
    ts = []
    for _ in range(reps):
        flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); f(); b.record(); b.synchronize(); ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    return float(np.median(ts[3:]))
launches = {"cusparse": lambda: A @ x.unsqueeze(1)}
for name, p in variants.items():
    problem = tpl.problem(spec, tpl.canonical(spec, p))
    if problem: print(name, "invalid:", problem); continue
    src, plan = tpl.render(spec, tpl.canonical(spec, p))
    path = f"/tmp/spmv_{len(launches)}.cu"; open(path, "w").write(src)
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-Xptxas", "-v", path, "-o", path + ".cubin"], capture_output=True, text=True)
    if r.returncode: print(name, r.stderr[-1500:]); continue
    fn = cp.RawModule(path=path + ".cubin").get_function(plan.entry)
    rl = resolve(plan, spec)
    launches[name] = (lambda fn=fn, g=rl.grid[0], b=rl.threads_per_block, s=rl.shared_bytes: fn((g,), (b,), (ptr(values), ptr(col), ptr(rowp), ptr(x), ptr(y), np.int32(nrows)), shared_mem=s))
for name, f in launches.items():
    if name != "cusparse":
        y.fill_(float("nan")); f(); torch.cuda.synchronize()
        print(name, "max rel err", ((y - ref).abs() / (ref.abs() + 1e-3)).max().item(), flush=True)
    else:
        f(); torch.cuda.synchronize()
if os.environ.get("NCU"): sys.exit(0)
for rnd in range(2):
    for name, f in launches.items():
        print(f"round {rnd} {name}: {timeit(f):.1f} us", flush=True)
