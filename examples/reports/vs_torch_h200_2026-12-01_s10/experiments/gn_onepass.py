"""Experiment: gn_tma.cu with one-pass shifted statistics (ONEPASS) and the slice's bulk copy split in NCOPY pieces."""
import subprocess, itertools
import numpy as np, cupy as cp, torch
from concurrent.futures import ThreadPoolExecutor
N, C, H, W, G = 8, 512, 128, 128, 32
configs = [  # onepass, ncopy, block, minb
    (0, 1, 256, 3), (1, 1, 256, 3), (0, 4, 256, 3), (1, 4, 256, 3), (1, 2, 256, 3), (1, 8, 256, 3),
    (1, 4, 512, 3), (1, 4, 128, 3), (1, 1, 512, 3), (0, 4, 512, 3),
]
def out(c): return "/tmp/op_%d_%d_%d_%d.cubin" % c
def build(c):
    o, n, b, m = c
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-DS=8", f"-DBLOCK={b}", "-DSTAGES=1", "-DTMA_STORE=0", "-DSTCS=0", f"-DMINB={m}", "-DSPLITSYNC=1", f"-DONEPASS={o}", f"-DNCOPY={n}", "exp/gn_tma.cu", "-o", out(c)], capture_output=True, text=True)
    return r.returncode, r.stderr[-300:]
with ThreadPoolExecutor(16) as ex: built = list(ex.map(build, configs))
x = torch.randn(N, C, H, W, device="cuda", dtype=torch.bfloat16) * 3 + 2
gamma = torch.randn(C, device="cuda", dtype=torch.bfloat16); beta = torch.randn(C, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x); mean = torch.empty(N * G, device="cuda", dtype=torch.bfloat16); rstd = torch.empty_like(mean)
ref = torch.nn.functional.group_norm(x.float(), G, gamma.float(), beta.float(), 1e-5)
flush = cp.empty(256 << 20, dtype=cp.uint8)
p = lambda t: np.uint64(t.data_ptr())
for rnd in range(2):
  for c, (rc, err) in zip(configs, built):
    if rc: print(c, "build failed", err); continue
    o, n, block, m = c
    fn = cp.RawModule(path=out(c)).get_function("gn_tma")
    smem = (C // G) * H * W * 2 // 8
    fn.max_dynamic_shared_size_bytes = smem
    grid = N * G * 8
    args = (p(x), p(gamma), p(beta), p(y), p(mean), p(rstd), np.int32(C), np.int32(H * W), np.int32(G), np.int32(N * G), np.uint64(0))
    ts = []
    for _ in range(40):
        flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); fn((grid,), (block,), args, shared_mem=smem); b.record(); b.synchronize(); ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    e = (y.float() - ref).abs().max().item()
    t = float(np.median(ts[5:]))
    print(f"onepass={o} ncopy={n} block={block} minb={m}: {t:.1f} us {268435456 / t / 4179e3 * 100:.1f}%  err {e:.3g}", flush=True)
