"""Experiment: the stream CSR SpMV kernel with the next tile's x gathers in flight while this tile is summed (the
entries loaded two tiles ahead), against the template's stream kernels and cuSPARSE on the suite's 2^22-row card."""
import os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np, cupy as cp, torch
sys.path.insert(0, os.getcwd())
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates.sparse import SparseTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
tk = task("spmv_csr")
spec = cards.spec(tk, "float32", 2**26, beyond=True)
d = tk.draw(spec.sizes, "float32", 1)
tpl = SparseTemplate()
base = {"strategy": "stream", "tpr": 1, "rpb": 512, "unroll": 1, "block": 1024, "items": 8, "vec": 4, "hint": "stream", "minb": 2, "cluster": 2}
OLD = """    Pack<T> v[CHUNKS];
    Pack<int> c[CHUNKS];
    int a = first & ~(VEC - 1);
    load_tile(values, col_idx, a, last, v, c);
    for (; a < last; a += TILE) {  // the same trip count in every thread: rp is shared
        // The products (chunk entries outside the block's rows are never summed), then the next tile's loads,
        // in flight while this one is summed.
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m) {
            const int k = threadIdx.x + m * BLOCK;
            if (a + k * VEC < last) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    prod[SKEW(k * VEC + j)] = to_f(v[m].e[j]) * to_f(GATHER(x + c[m].e[j]));
                }
            }
        }
        load_tile(values, col_idx, a + TILE, last, v, c);
        __syncthreads();
"""
NEW = """    Pack<T> v[CHUNKS], vn[CHUNKS];
    Pack<int> c[CHUNKS];
    float g[CHUNKS][VEC];
    int a = first & ~(VEC - 1);
    load_tile(values, col_idx, a, last, v, c);
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
        const bool in = a + (threadIdx.x + m * BLOCK) * VEC < last;
#pragma unroll
        for (int j = 0; j < VEC; ++j) { g[m][j] = in ? to_f(GATHER(x + c[m].e[j])) : 0.0f; }
    }
    load_tile(values, col_idx, a + TILE, last, vn, c);
    for (; a < last; a += TILE) {
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m) {
            const int k = threadIdx.x + m * BLOCK;
            if (a + k * VEC < last) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    prod[SKEW(k * VEC + j)] = to_f(v[m].e[j]) * g[m][j];
                }
            }
        }
        // The next tile's gathers (its entries arrived during this iteration's wait), then the one after's loads.
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m) {
            v[m] = vn[m];
            const bool in = a + TILE + (threadIdx.x + m * BLOCK) * VEC < last;
#pragma unroll
            for (int j = 0; j < VEC; ++j) { g[m][j] = in ? to_f(GATHER(x + c[m].e[j])) : 0.0f; }
        }
        load_tile(values, col_idx, a + 2 * TILE, last, vn, c);
        __syncthreads();
"""
configs = []
for p in ({}, {"minb": 1}, {"block": 512, "items": 8, "minb": 2}, {"block": 512, "items": 16, "minb": 2}, {"block": 512, "items": 8, "minb": 4}, {"block": 256, "items": 16, "rpb": 256, "minb": 4}, {"block": 256, "items": 8, "rpb": 256, "minb": 4}, {"block": 1024, "items": 4, "rpb": 256, "minb": 2}):
    q = {**base, **p}
    for ahead in (False, True):
        configs.append((("ahead " if ahead else "stream ") + " ".join(f"{k}{v}" for k, v in p.items()), q, ahead))
def build(item):
    i, (name, p, ahead) = item
    src, plan = tpl.render(spec, tpl.canonical(spec, p))
    if ahead:
        assert OLD in src; src = src.replace(OLD, NEW)
    path = f"/tmp/ahead_{i}.cu"; open(path, "w").write(src)
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-Xptxas", "-v", path, "-o", path + ".cubin"], capture_output=True, text=True)
    regs = [l.strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l]
    return name, plan, (path + ".cubin" if r.returncode == 0 else None), r.stderr[-800:] if r.returncode else " | ".join(regs)
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
for rnd in range(2):
    for t, name in sorted(((timeit(f), name) for name, f in launches)): print(f"round {rnd} {t:7.1f} us  {name}", flush=True)
