"""Experiment: phase timings inside the TMA group_norm kernels (globaltimer/clock64 stamps of thread 0 of each block)."""
import os, subprocess, sys
import numpy as np, cupy as cp, torch
from cuda.bindings import driver as cu
N, C, H, W, G = 8, 512, 128, 128, 32
src = "exp/gn_tma.cu"
configs = [  # S, block, stages, tma_store, minb, clusters, ilp, splitsync, keep chunks, prefetch
    (8, 256, 1, 0, 3, 256, 0, 1, 0, 0),
    (8, 256, 1, 0, 4, 256, 0, 1, 3520, 0), (8, 256, 1, 0, 4, 256, 0, 1, 3520, 1),
    (8, 256, 1, 0, 5, 256, 0, 1, 2816, 0), (8, 256, 1, 0, 5, 256, 0, 1, 2816, 1),
    (8, 256, 1, 0, 6, 256, 0, 1, 2304, 1), (8, 128, 1, 0, 8, 256, 0, 1, 1728, 1), (8, 128, 1, 0, 6, 256, 0, 1, 2304, 1),
    (8, 128, 1, 0, 4, 256, 0, 1, 3520, 1), (4, 256, 1, 0, 2, 256, 0, 1, 7104, 1), (4, 512, 1, 0, 2, 256, 0, 1, 7104, 1),
]
old_configs = [
    (8, 256, 1, 0, 3, 256, 0), (8, 256, 1, 0, 3, 256, 1), (8, 256, 1, 1, 3, 256, 1),
    (8, 256, 3, 0, 1, 15, 1), (8, 512, 3, 0, 1, 15, 1), (8, 1024, 3, 0, 1, 15, 1), (8, 1024, 3, 1, 1, 15, 1), (8, 512, 3, 1, 1, 15, 1),
    (8, 1024, 2, 0, 1, 15, 1), (8, 1024, 3, 0, 1, 14, 1), (8, 512, 2, 0, 1, 30, 1), (8, 1024, 1, 0, 2, 256, 1),
]
x = torch.randn(N, C, H, W, device="cuda", dtype=torch.bfloat16)
gamma = torch.ones(C, device="cuda", dtype=torch.bfloat16); beta = torch.zeros(C, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x); mean = torch.empty(N * G, device="cuda", dtype=torch.bfloat16); rstd = torch.empty_like(mean)
ref = torch.nn.functional.group_norm(x.float(), G, gamma.float(), beta.float(), 1e-5)
flush = cp.empty(256 << 20, dtype=cp.uint8)
p = lambda t: np.uint64(t.data_ptr())
from concurrent.futures import ThreadPoolExecutor
def prebuild(job):
    (S, block, stages, ts, minb, clusters, ilp, sp, keep, pf), probe = job
    out = f"/tmp/probe_{S}_{block}_{stages}_{ts}_{probe}_{ilp}_{minb}_{sp}_{keep}_{pf}.cubin"
    subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", f"-DS={S}", f"-DBLOCK={block}", f"-DSTAGES={stages}", f"-DTMA_STORE={ts}", "-DSTCS=0", f"-DMINB={minb}", f"-DPROBE={probe}", f"-DILP={ilp}", f"-DSPLITSYNC={sp}", f"-DKEEP_CHUNKS={keep}", f"-DPREFETCH={pf}", src, "-o", out], capture_output=True, text=True)
with ThreadPoolExecutor(16) as ex: list(ex.map(prebuild, [(c, p) for c in configs for p in (0,)]))
for S, block, stages, ts, minb, clusters, ilp, sp, keep, pf in configs:
    slice_bytes = (C // G) * H * W * 2 // S if not keep else keep * 16
    res = {}
    for probe in (0,):
        out = f"/tmp/probe_{S}_{block}_{stages}_{ts}_{probe}_{ilp}_{minb}_{sp}_{keep}_{pf}.cubin"
        r = subprocess.run(["true"]) if os.path.exists(out) else subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", f"-DS={S}", f"-DBLOCK={block}", f"-DSTAGES={stages}", f"-DTMA_STORE={ts}", "-DSTCS=0", f"-DMINB={minb}", f"-DPROBE={probe}", f"-DILP={ilp}", f"-DSPLITSYNC={sp}", f"-DKEEP_CHUNKS={keep}", f"-DPREFETCH={pf}", src, "-o", out], capture_output=True, text=True)
        if r.returncode: print("build failed", r.stderr[-400:]); break
        fn = cp.RawModule(path=out).get_function("gn_tma")
        smem = stages * slice_bytes
        if smem > 48 * 1024: fn.max_dynamic_shared_size_bytes = smem
        if S > 8:
            cp.cuda.driver.funcSetAttribute(fn.kernel.ptr if hasattr(fn, "kernel") else fn._kernel.ptr, int(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED), 1)
        grid = clusters * S
        buf = torch.zeros(grid * 2 * 8, dtype=torch.int64, device="cuda")
        args = (p(x), p(gamma), p(beta), p(y), p(mean), p(rstd), np.int32(C), np.int32(H * W), np.int32(G), np.int32(N * G), p(buf))
        ts_ = []
        for _ in range(15):
            flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); fn((grid,), (block,), args, shared_mem=smem); b.record(); b.synchronize(); ts_.append(cp.cuda.get_elapsed_time(a, b) * 1000)
        err = (y.float() - ref).abs().max().item()
        res[probe] = float(np.median(ts_[3:]))
        print(f"S={S} block={block} ts={ts} minb={minb} ilp={ilp} splitsync={sp} keep={keep} prefetch={pf}: {res[0]:.1f} us {268435456 / res[0] / 4195e3 * 100:.1f}%  err {err:.3g}", flush=True)
        if probe:
            pr = buf.view(grid, 2, 8).cpu().numpy().astype(np.int64)
            it0 = pr[:, 0]
            start = (it0[:, 0] - it0[:, 0].min()) / 1000.0; end = (it0[:, 6] - it0[:, 0].min()) / 1000.0
            ph = {"issue->wait": it0[:, 1] - it0[:, 7], "data wait": it0[:, 2] - it0[:, 1], "pass1+csum": it0[:, 3] - it0[:, 2], "pass2+csum": it0[:, 4] - it0[:, 3], "normalise": it0[:, 5] - it0[:, 4]}
            if stages > 1:
                it1 = pr[:, 1]; ph["iter1 wait"] = it1[:, 2] - it1[:, 1]; ph["iter0 end->iter1"] = it1[:, 1] - it0[:, 5]; ph["it1 pass1"] = it1[:, 3] - it1[:, 2]; ph["it1 pass2"] = it1[:, 4] - it1[:, 3]; ph["it1 norm"] = it1[:, 5] - it1[:, 4]
            print(f"S={S} block={block} stages={stages} tma_store={ts} clusters={clusters} ilp={ilp} minb={minb}: {res[0]:.1f} us (probed {res[1]:.1f}), err {err:.3g}")
            print("  cycles median/p90: " + ", ".join(f"{k} {np.median(v):.0f}/{np.percentile(v, 90):.0f}" for k, v in ph.items()))
            print(f"  block start us: quantiles {np.percentile(start, [0, 25, 50, 75, 100]).round(1)}; block lifetime us median {np.median(end - start):.1f} p90 {np.percentile(end - start, 90):.1f}; kernel span {end.max():.1f}")
            hist = np.histogram(start, bins=12)[0]; print("  starts histogram:", hist.tolist())
        sys.stdout.flush()
