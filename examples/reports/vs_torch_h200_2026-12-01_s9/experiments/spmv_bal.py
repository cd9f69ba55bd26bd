"""Experiment: the working tree's balanced CSR SpMV variants against stream and cuSPARSE on the 2^22-row card."""
import json, os, subprocess, sys, time, itertools
from concurrent.futures import ThreadPoolExecutor
import numpy as np, cupy as cp, torch
sys.path.insert(0, os.getcwd())
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates.sparse import SparseTemplate, csr_seeds
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
OUT = os.environ.get("OUT", "/tmp")
tk = task("spmv_csr"); spec = cards.spec(tk, "float32", 2**26, beyond=True)
tpl = SparseTemplate()
seeds = [p for p in csr_seeds(spec) if p["strategy"] in ("balanced", "stream")]
params = list(seeds)
base = next(p for p in seeds if p["strategy"] == "balanced")
for cl, block, items, rpb, minb in itertools.product((2, 4, 8), (512, 1024), (8, 16), (64, 128, 256, 512), (1, 2, 4)):
    q = tpl.valid(spec, {**base, "cluster": cl, "block": block, "items": items, "rpb": rpb, "minb": minb})
    if q and q not in params and cl * rpb * 16 >= 2 * block * items: params.append(q)
print(len(params), "variants", flush=True)
work = "/tmp/spbal"; os.makedirs(work, exist_ok=True)
vs = []
for p in params:
    src, plan = tpl.render(spec, p); vs.append(dict(params=p, src=src, plan=plan))
def build(i):
    v = vs[i]; path = f"{work}/k{i}.cu"; open(path, "w").write(v["src"])
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", path, "-o", f"{work}/k{i}.cubin"], capture_output=True, text=True)
    v["cubin"] = f"{work}/k{i}.cubin" if r.returncode == 0 else None; v["err"] = r.stderr[-500:]
t0 = time.time()
with ThreadPoolExecutor(16) as ex:
    fut = ex.map(build, range(len(vs)))
    d = tk.draw(spec.sizes, "float32", 1)
    list(fut)
print("drawn and built in", time.time() - t0, flush=True)
nrows = spec.sizes["nrows"]
dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
values, col, rowp, x = dev(d["values"]), dev(d["col_idx"]), dev(d["row_ptr"]), dev(d["x"])
y = torch.empty(nrows, device="cuda", dtype=torch.float32)
flush = cp.empty(256 << 20, dtype=cp.uint8)
ptr = lambda t: np.uint64(t.data_ptr())
def timeit(f, reps=25):
    ts = []
    for _ in range(reps):
        flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); f(); b.record(); b.synchronize(); ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    return float(np.median(ts[3:]))
A = torch.sparse_csr_tensor(rowp, col, values, size=(nrows, nrows))
ref = (A @ x.unsqueeze(1)).squeeze(1).double()
ref64 = None
cus = timeit(lambda: A @ x.unsqueeze(1)); print("cuSPARSE", cus, flush=True)
rows = []
for v in vs:
    if not v["cubin"]: print("BUILD FAILED", v["params"], v["err"][-300:]); continue
    try:
        fn = cp.RawModule(path=v["cubin"]).get_function(v["plan"].entry)
        r = resolve(v["plan"], spec)
        args = (ptr(values), ptr(col), ptr(rowp), ptr(x), ptr(y), np.int32(nrows))
        launch = lambda: fn((r.grid[0],), (r.threads_per_block,), args)
        y.fill_(float("nan")); launch(); torch.cuda.synchronize()
        bad = int((~torch.isclose(y.double(), ref, rtol=1e-4, atol=1e-4)).sum().item())
        us = timeit(launch)
    except Exception as e:
        print("FAILED", v["params"], repr(e)[:300], flush=True); continue
    rows.append(dict(params=v["params"], us=us, bad=bad))
    print(f"{us:7.1f} us  {us / cus:.3f}x cuSPARSE  bad {bad}  {v['params']}", flush=True)
json.dump(dict(cusparse_us=cus, kernels=rows), open(f"{OUT}/spmv_bal.json", "w"), indent=1)
