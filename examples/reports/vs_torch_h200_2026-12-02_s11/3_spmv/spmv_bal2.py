"""Experiment: the sparse template's balanced CSR SpMV kernel with its shared memory made dynamic (so a cluster may
own more rows than 48 KB of static shared memory holds), against stream and cuSPARSE on the suite's 2^22-row card."""
import itertools, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np, cupy as cp, torch
sys.path.insert(0, os.getcwd())
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates.sparse import SparseTemplate, stream_shared_bytes
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
tk = task("spmv_csr")
spec = cards.spec(tk, "float32", 2**26, beyond=True)
d = tk.draw(spec.sizes, "float32", 1)
tpl = SparseTemplate()
stream = {"strategy": "stream", "tpr": 1, "rpb": 512, "unroll": 1, "block": 1024, "items": 8, "vec": 4, "hint": "stream", "minb": 2, "cluster": 2}
configs = [("stream", stream)]
for cluster, rows, (block, items, minb) in itertools.product((4, 8), (2048, 4096, 8192), ((1024, 8, 2), (512, 16, 2), (512, 8, 4), (256, 16, 4))):
    p = {**stream, "strategy": "balanced", "cluster": cluster, "rpb": rows // cluster, "block": block, "items": items, "minb": minb}
    if stream_shared_bytes(p) * minb <= 227 * 1024:
        name = f"bal c{cluster} rows{rows} b{block} i{items} m{minb}"
        if not os.environ.get("ONLY") or name in os.environ["ONLY"].split(","):
            configs.append((name, p))
OLD = """    __shared__ int rp[ROWS + 1];  // the cluster's row pointers (a block's range may span any of its rows)
    __shared__ float acc[ROWS];  // their sums over this block's range of entries
    __shared__ float prod[SKEW(TILE - 1) + 1];  // a tile's products value * x[col]
"""
NEW = """    extern __shared__ int dyn[];
    int* rp = dyn;
    float* acc = reinterpret_cast<float*>(dyn + ROWS + 1);
    float* prod = acc + ROWS;
"""
def build(item):
    i, (name, p) = item
    src, plan = tpl.render(spec, tpl.canonical(spec, p))
    shared = 0
    if p["strategy"] == "balanced":
        assert OLD in src; src = src.replace(OLD, NEW); shared = stream_shared_bytes(p)
    path = f"/tmp/bal_{i}.cu"; open(path, "w").write(src)
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", path, "-o", path + ".cubin"], capture_output=True, text=True)
    return name, p, plan, shared, (path + ".cubin" if r.returncode == 0 else None), r.stderr[-800:]
with ThreadPoolExecutor(16) as ex: built = list(ex.map(build, enumerate(configs)))
dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
values, col, rowp, x = dev(d["values"]), dev(d["col_idx"]), dev(d["row_ptr"]), dev(d["x"])
nrows = spec.sizes["nrows"]
y = torch.empty(nrows, device="cuda", dtype=torch.float32)
A = torch.sparse_csr_tensor(rowp, col, values, size=(nrows, x.numel()))
ref = (A @ x.unsqueeze(1)).squeeze(1)
flush = cp.empty(256 << 20, dtype=cp.uint8)
ptr = lambda t: np.uint64(t.data_ptr())
def timeit(f, reps=20):
    ts = []
    for _ in range(reps):
        flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); f(); b.record(); b.synchronize(); ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    return float(np.median(ts[3:]))
launches = [("cusparse", lambda: A @ x.unsqueeze(1))]
for name, p, plan, shared, cubin, err in built:
    if cubin is None: print(name, "BUILD FAILED", err); continue
    fn = cp.RawModule(path=cubin).get_function(plan.entry)
    if shared > 48 * 1024: fn.max_dynamic_shared_size_bytes = shared
    rl = resolve(plan, spec)
    f = lambda fn=fn, g=rl.grid[0], b=rl.threads_per_block, s=shared: fn((g,), (b,), (ptr(values), ptr(col), ptr(rowp), ptr(x), ptr(y), np.int32(nrows)), shared_mem=s)
    y.fill_(float("nan")); f(); torch.cuda.synchronize()
    e = ((y - ref).abs() / (ref.abs() + 1e-3)).max().item()
    print(f"{name}: shared {shared} err {e:.2e}", flush=True)
    if e > 1e-3 or e != e: continue
    launches.append((name, f))
if os.environ.get("NCU"):
    sys.exit(0)
for rnd in range(2):
    res = sorted(((timeit(f), name) for name, f in launches))
    for t, name in res: print(f"round {rnd} {t:7.1f} us  {name}", flush=True)
