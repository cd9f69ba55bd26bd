"""Launch chosen configs of spread_time.py once each (for ncu)."""
import os, subprocess, sys
sys.path.insert(0, os.getcwd())
exec(open("examples/reports/vs_torch_h200_2026-12-02_s12/3_spmv/spmv_time.py").read().split("EXTRA =")[0])
from kernelforge_tui.cards.plan import resolve
import numpy as np, cupy as cp, torch
names = sys.argv[1:]
d = tk.draw(spec.sizes, "float32", 1)
dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
values, col, rowp, x = dev(d["values"]), dev(d["col_idx"]), dev(d["row_ptr"]), dev(d["x"])
nrows = spec.sizes["nrows"]
y = torch.empty(nrows, device="cuda", dtype=torch.float32)
ptr = lambda t: np.uint64(t.data_ptr())
for i, (name, p) in enumerate(configs):
    if name not in names: continue
    q = tpl.canonical(spec, {**base, **p})
    src, plan = tpl.render(spec, q)
    path = f"/tmp/one_{i}.cu"; open(path, "w").write(src.replace("kf_spmv_csr", f"kf_spmv_csr_{i}"))
    subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", path, "-o", path + ".cubin"], check=True)
    fn = cp.RawModule(path=path + ".cubin").get_function(f"kf_spmv_csr_{i}")
    rl = resolve(plan, spec)
    print(i, name, flush=True)
    fn((rl.grid[0],), (rl.threads_per_block,), (ptr(values), ptr(col), ptr(rowp), ptr(x), ptr(y), np.int32(nrows)))
    torch.cuda.synchronize()
