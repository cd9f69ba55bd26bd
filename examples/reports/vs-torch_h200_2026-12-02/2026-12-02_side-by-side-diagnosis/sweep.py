"""Experiment: the spread CSR SpMV strategy (a cluster's long rows shared out over its blocks) against stream and
cuSPARSE on the suite's 2^22-row fp32 card, side by side, L2 flushed before each call."""
import itertools, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, os.getcwd())
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates.sparse import SparseTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
tk = task("spmv_csr")
spec = cards.spec(tk, "float32", 2**26, beyond=True)
tpl = SparseTemplate()
import importlib.util
_spec = importlib.util.spec_from_file_location("sparse_old", "exp/sparse_old.py"); _old = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(_old)
old_tpl = _old.SparseTemplate()
base = {"strategy": "stream", "tpr": 1, "rpb": 512, "unroll": 1, "block": 1024, "items": 8, "vec": 4, "hint": "stream", "minb": 2, "cluster": 2, "long": 256}
A = {"strategy": "adopt", "long": 4096, "block": 256, "rpb": 256, "minb": 4, "items": 4}
configs = [(os.environ.get("NAMES", "adopt %s") % (p,), {**A, **p}) for p in eval(os.environ["CONFIGS"])]
EXTRA = os.environ.get("EXTRA")
if __name__ == "__main__":
    import numpy as np, cupy as cp, torch
    def build(item):
        i, (name, p) = item
        p = dict(p); t = old_tpl if p.pop("old", 0) else tpl
        q = t.canonical(spec, {**base, **p})  # past the space too: clusters of 1, rows never long
        src, plan = t.render(spec, q)
        path = f"/tmp/spread_{i}.cu"; open(path, "w").write(src)
        r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-Xptxas", "-v", path, "-o", path + ".cubin"], capture_output=True, text=True)
        regs = [l.strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l]
        return name, plan, (path + ".cubin" if r.returncode == 0 else None), r.stderr[-800:] if r.returncode else " | ".join(regs)
    with ThreadPoolExecutor(16) as ex: built = list(ex.map(build, enumerate(configs)))
    d = tk.draw(spec.sizes, "float32", 1)
    dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
    values, col, rowp, x = dev(d["values"]), dev(d["col_idx"]), dev(d["row_ptr"]), dev(d["x"])
    nrows = spec.sizes["nrows"]
    y = torch.empty(nrows, device="cuda", dtype=torch.float32)
    A = torch.sparse_csr_tensor(rowp, col, values, size=(nrows, x.numel()))
    ref = A @ x
    flush = cp.empty(256 << 20, dtype=cp.uint8)
    ptr = lambda t: np.uint64(t.data_ptr())
    def timeit(f, reps=30):
        ts = []
        for _ in range(reps):
            flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); f(); b.record(); b.synchronize(); ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
        return float(np.median(ts[3:]))
    launches = [("cusparse A@x", lambda: A @ x)]
    for name, plan, cubin, info in built:
        print(name, info, flush=True)
        if cubin is None: continue
        fn = cp.RawModule(path=cubin).get_function(plan.entry)
        rl = resolve(plan, spec)
        f = lambda fn=fn, g=rl.grid[0], b=rl.threads_per_block: fn((g,), (b,), (ptr(values), ptr(col), ptr(rowp), ptr(x), ptr(y), np.int32(nrows)))
        y.fill_(float("nan")); f(); torch.cuda.synchronize()
        e = ((y - ref).abs() / (ref.abs() + 1e-3)).max().item()
        print(f"  err {e:.2e}", flush=True)
        if e > 1e-3 or e != e: continue
        launches.append((name, f))
    for rnd in range(3):
        for t, name in sorted(((timeit(f), name) for name, f in launches)): print(f"round {rnd} {t:7.1f} us  {name}", flush=True)
