"""Experiment (not part of the product): CSR SpMV kernels of the template on the 2^22-row card, vs cuSPARSE, and the
same kernels on the matrix with its row blocks reordered heaviest first (the tail hypothesis)."""
import json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import cupy as cp
import torch

sys.path.insert(0, os.getcwd())
from kernelforge_tui.cards.plan import resolve
sys.path.insert(0, "exp"); from sparse_head import SparseTemplate, csr_seeds
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task

OUT = os.environ.get("OUT", "/tmp")
tk = task("spmv_csr")
spec = cards.spec(tk, "float32", 2**26, beyond=True)
t0 = time.time()
d = tk.draw(spec.sizes, "float32", 1)
print("drawn in", time.time() - t0, flush=True)
tpl = SparseTemplate()
params = [p for p in csr_seeds(spec) if p["strategy"] != "vector"][:1]
extra = [dict(p) for p in params]
for p in list(params):
    if p["strategy"] == "stream":
        for rpb in (1024, 2048):
            q = {**p, "rpb": rpb}
            if tpl.valid(spec, q) and q not in params: params.append(q)
params += [p for p in (tpl.valid(spec, {**q, "block": b, "items": it, "rpb": r, "minb": m}) for q in extra for b, it, r, m in ((1024, 8, 512, 2), (1024, 8, 1024, 2), (512, 16, 1024, 2), (1024, 16, 1024, 1), (512, 8, 512, 4))) if p and p not in params]
if os.environ.get("WITH_BALANCED"):
    pass
work = "/tmp/spexp"; os.makedirs(work, exist_ok=True)
vs = []
HINTS = {
 "H1": ("once_na", "__ldg"), "H2": ("once_ef", "__ldg"), "H3": ("once_na", "gather_el"), "H4": ("once_ef", "gather_el"), "H5": ("__ldcs", "gather_el"),
}
ASM = open("exp/hints.cuh").read()
for i, p in enumerate(params):
    if tpl.valid(spec, p) is None: continue
    src, plan = tpl.render(spec, p)
    vs.append(dict(params=p, src=src, plan=plan))
    if p["block"] == 1024 and p["items"] == 8 and p["rpb"] in (512, 1024) or (p["block"], p["items"], p["rpb"]) == (512, 16, 1024):
        for h, (once, gather) in HINTS.items():
            hs = src.replace("#define ONCE(p) __ldcs(p)", ASM + f"#define ONCE(p) {once}(p)").replace("#define GATHER(p) __ldg(p)", f"#define GATHER(p) {gather}(p)")
            assert hs != src
            vs.append(dict(params={**p, "asm_hint": h}, src=hs, plan=plan))
def build(i):
    v = vs[i]; path = f"{work}/k{i}.cu"; open(path, "w").write(v["src"])
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", path, "-o", f"{work}/k{i}.cubin"], capture_output=True, text=True)
    v["cubin"] = f"{work}/k{i}.cubin" if r.returncode == 0 else None; v["err"] = r.stderr[-500:]
with ThreadPoolExecutor(16) as ex: list(ex.map(build, range(len(vs))))

nrows = spec.sizes["nrows"]
rp = d["row_ptr"].astype(np.int64); L = np.diff(rp)
def heavy_first(rpb):
    """Row blocks of rpb rows reordered by their entries, heaviest first (rows within a block kept)."""
    nb = -(-nrows // rpb)
    work = np.add.reduceat(L, np.arange(0, nrows, rpb))
    order = np.argsort(-work, kind="stable")
    rows = np.concatenate([np.arange(b * rpb, min(nrows, (b + 1) * rpb)) for b in order])
    newL = L[rows]
    newrp = np.concatenate([[0], np.cumsum(newL)])
    idx = np.concatenate([np.arange(rp[r], rp[r + 1]) for r in rows]) if False else None
    # entries: gather row by row through a vectorised repeat
    starts = rp[rows]
    ent = np.repeat(starts - newrp[:-1], newL) + np.arange(newrp[-1])
    return newrp.astype(np.int32), ent, rows

dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
values, col, rowp, x = dev(d["values"]), dev(d["col_idx"]), dev(d["row_ptr"]), dev(d["x"])
y = torch.empty(nrows, device="cuda", dtype=torch.float32)
flush = cp.empty(256 * 1024 * 1024, dtype=cp.uint8)
ptr = lambda t: np.uint64(t.data_ptr())
def timeit(f, reps=30):
    ts = []
    for _ in range(reps):
        flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); f(); b.record(); b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    return float(np.median(ts[3:]))
A = torch.sparse_csr_tensor(rowp, col, values, size=(nrows, nrows))
ref = (A @ x.unsqueeze(1)).squeeze(1)
res = {"cusparse_us": timeit(lambda: A @ x.unsqueeze(1))}
print("cuSPARSE", res["cusparse_us"], flush=True)
ncu = "--ncu" in sys.argv
mats = {"suite": (values, col, rowp, None)}
for rpb in (512, 1024):
    if ncu: break
    nrp, ent, rows = heavy_first(rpb)
    mats[f"heavy_first_{rpb}"] = (values[dev(ent)], col[dev(ent)], dev(nrp), rows)
res["kernels"] = []
for v in vs:
    if not v["cubin"]: print("BUILD FAILED", v["params"], v["err"]); continue
    fn = cp.RawModule(path=v["cubin"]).get_function(v["plan"].entry)
    grid = resolve(v["plan"], spec).grid[0]; block = resolve(v["plan"], spec).threads_per_block
    row = dict(params=v["params"])
    for mname, (vv, cc, rr, rows) in mats.items():
        if mname.startswith("heavy_first") and (mname != f"heavy_first_{v['params']['rpb']}" or v["params"].get("asm_hint") not in (None, "H3")): continue
        args = (ptr(vv), ptr(cc), ptr(rr), ptr(x), ptr(y), np.int32(nrows))
        launch = lambda: fn((grid,), (block,), args)
        y.fill_(float("nan")); launch(); torch.cuda.synchronize()
        want = ref if rows is None else ref[dev(rows)]
        err = ((y - want).abs() / (want.abs() + 1e-3)).max().item()
        if ncu: continue
        row[mname] = timeit(launch); row[mname + "_err"] = err
    res["kernels"].append(row)
    print(json.dumps(row), flush=True)
json.dump(res, open(f"{OUT}/spmv_exp.json", "w"), indent=1)
