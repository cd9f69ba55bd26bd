"""Experiment: the template's bulk shifted-moments group_norm kernel and push_variants.py's edits of it, beside the
hand-written gn_tma.cu (ONEPASS), timed alike: CUDA events around one launch, L2 flushed before each, median;
y, mean and rstd checked against torch."""
import glob, subprocess, sys
import numpy as np, cupy as cp, torch
from concurrent.futures import ThreadPoolExecutor
N, C, H, W, G = 8, 512, 128, 128, 32
tpl = sorted(glob.glob("exp/p*_*.cu"))
def build(f):
    out = "/tmp/" + f.split("/")[-1][:-3] + ".cubin"
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-diag-suppress", "177,550", f, "-o", out], capture_output=True, text=True)
    if r.returncode: print(f, r.stderr[-2000:])
    return out if r.returncode == 0 else None
def build_hand():
    out = "/tmp/hand_onepass.cubin"
    subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-DS=8", "-DBLOCK=256", "-DSTAGES=1", "-DTMA_STORE=0", "-DSTCS=0", "-DMINB=3", "-DSPLITSYNC=1", "-DONEPASS=1", "-DNCOPY=1", "exp/gn_tma.cu", "-o", out], capture_output=True)
    return out
with ThreadPoolExecutor(16) as ex: built = list(ex.map(build, tpl)); hand = build_hand()
gamma = torch.randn(C, device="cuda", dtype=torch.bfloat16); beta = torch.randn(C, device="cuda", dtype=torch.bfloat16)
x = torch.empty(N, C, H, W, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x); mean = torch.empty(N * G, device="cuda", dtype=torch.bfloat16); rstd = torch.empty_like(mean)
flush = cp.empty(256 << 20, dtype=cp.uint8)
p = lambda t: np.uint64(t.data_ptr())
smem = (C // G) * H * W * 2 // 8
kernels = []
for f, out in zip(tpl, built):
    if out is None: continue
    fn = cp.RawModule(path=out).get_function("kf_group_norm"); fn.max_dynamic_shared_size_bytes = smem
    kernels.append((f.split("/")[-1], fn, (p(x), p(gamma), p(beta), p(y), p(mean), p(rstd), np.int32(C), np.int32(H * W), np.int32(G))))
fn = cp.RawModule(path=hand).get_function("gn_tma"); fn.max_dynamic_shared_size_bytes = smem
kernels.append(("hand_onepass", fn, (p(x), p(gamma), p(beta), p(y), p(mean), p(rstd), np.int32(C), np.int32(H * W), np.int32(G), np.int32(N * G), np.uint64(0))))
def launch(fn, args): fn((N * G * 8,), (256,), args, shared_mem=smem)
def check(name, fn, args, label):
    y.fill_(float("nan")); mean.fill_(float("nan")); rstd.fill_(float("nan"))
    launch(fn, args); torch.cuda.synchronize()
    xf = x.float(); ref = torch.nn.functional.group_norm(xf, G, gamma.float(), beta.float(), 1e-5)
    xg = xf.view(N * G, -1); m = xg.mean(1); r = torch.rsqrt(xg.var(1, unbiased=False) + 1e-5)
    def bad(o, e): return int(((o.float() - e).abs() > 1e-5 + 1.6e-2 * e.abs()).sum().item() + torch.isnan(o.float()).sum().item())
    return f"{label}: y bad {bad(y, ref)} mean bad {bad(mean, m)} rstd bad {bad(rstd, r)}"
datasets = {"randn*3+2": lambda: torch.randn(N, C, H, W, device="cuda") * 3 + 2,
            "zero-mean*1000": lambda: torch.randn(N, C, H, W, device="cuda") * 1000,
            "outlier-first": lambda: (lambda t: (t.view(N * G, -1).__setitem__((slice(None), 0), 5e4), t)[1])(torch.randn(N, C, H, W, device="cuda"))}
for name, fn, args in kernels:
    res = []
    for label, make in datasets.items():
        x.copy_(make().to(torch.bfloat16)); res.append(check(name, fn, args, label))
    print(name, " | ".join(res), flush=True)
x.copy_((torch.randn(N, C, H, W, device="cuda") * 3 + 2).to(torch.bfloat16))
for rnd in range(3):
    for name, fn, args in kernels:
        ts = []
        for _ in range(40):
            flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); launch(fn, args); b.record(); b.synchronize(); ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
        t = float(np.median(ts[5:]))
        print(f"round {rnd} {name}: {t:.1f} us {268435456 / t / 4213e3 * 100:.1f}%", flush=True)
