"""Experiment: the template's bulk shifted-moments group_norm kernel (stats outputs) and text edits of it, beside the
hand-written gn_tma.cu (ONEPASS), timed alike: CUDA events around one launch, L2 flushed before each, median."""
import glob, subprocess
import numpy as np, cupy as cp, torch
from concurrent.futures import ThreadPoolExecutor
N, C, H, W, G = 8, 512, 128, 128, 32
tpl = sorted(glob.glob("exp/tpl_t*.cu"))
def build(f):
    out = "/tmp/" + f.split("/")[-1][:-3] + ".cubin"
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", f, "-o", out], capture_output=True, text=True)
    return out if r.returncode == 0 else None
def build_hand():
    out = "/tmp/hand_onepass.cubin"
    subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-DS=8", "-DBLOCK=256", "-DSTAGES=1", "-DTMA_STORE=0", "-DSTCS=0", "-DMINB=3", "-DSPLITSYNC=1", "-DONEPASS=1", "-DNCOPY=1", "exp/gn_tma.cu", "-o", out], capture_output=True)
    return out
with ThreadPoolExecutor(16) as ex: built = list(ex.map(build, tpl)); hand = build_hand()
x = torch.randn(N, C, H, W, device="cuda", dtype=torch.bfloat16) * 3 + 2
gamma = torch.randn(C, device="cuda", dtype=torch.bfloat16); beta = torch.randn(C, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x); mean = torch.empty(N * G, device="cuda", dtype=torch.bfloat16); rstd = torch.empty_like(mean)
ref = torch.nn.functional.group_norm(x.float(), G, gamma.float(), beta.float(), 1e-5)
flush = cp.empty(256 << 20, dtype=cp.uint8)
p = lambda t: np.uint64(t.data_ptr())
smem = (C // G) * H * W * 2 // 8
kernels = []
for f, out in zip(tpl, built):
    if out is None: print(f, "build failed"); continue
    fn = cp.RawModule(path=out).get_function("kf_group_norm"); fn.max_dynamic_shared_size_bytes = smem
    kernels.append((f.split("/")[-1], fn, (p(x), p(gamma), p(beta), p(y), p(mean), p(rstd), np.int32(C), np.int32(H * W), np.int32(G))))
fn = cp.RawModule(path=hand).get_function("gn_tma"); fn.max_dynamic_shared_size_bytes = smem
kernels.append(("hand_onepass", fn, (p(x), p(gamma), p(beta), p(y), p(mean), p(rstd), np.int32(C), np.int32(H * W), np.int32(G), np.int32(N * G), np.uint64(0))))
for rnd in range(2):
    for name, fn, args in kernels:
        ts = []
        for _ in range(40):
            flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); fn((N * G * 8,), (256,), args, shared_mem=smem); b.record(); b.synchronize(); ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
        e = (y.float() - ref).abs().max().item()
        t = float(np.median(ts[5:]))
        print(f"{name}: {t:.1f} us {268435456 / t / 4189e3 * 100:.1f}%  err {e:.3g}", flush=True)
