"""Experiment (not part of the product): group_norm kernels on the H200, timed side by side."""
import json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import cupy as cp
import torch
from cuda.bindings import driver as cu

sys.path.insert(0, os.getcwd())
from kernelforge_tui.cards import resolve
from kernelforge_tui.proposers.templates.group_norm import GroupNormTemplate
from tests.test_group_norm_template import group_norm_card

N, C, H, W, G = 8, 512, 128, 128, 32
OUT = os.environ.get("OUT", "/tmp")
card = group_norm_card("gn", "bfloat16", {"n": N, "c": C, "h": H, "w": W, "groups": G}, stats=True)
tpl = GroupNormTemplate()
work = "/tmp/gnexp"; os.makedirs(work, exist_ok=True)
variants = []  # (name, source_path_or_text, defines, grid, block, smem, args_kind)

def template(params):
    src, plan = tpl.render(card, params)
    r = resolve(plan, card)
    name = "tpl " + " ".join(f"{k}={v}" for k, v in params.items())
    variants.append(dict(name=name, src=src, defines=[], entry=plan.entry, grid=r.grid[0], block=r.threads_per_block,
                         smem=plan.shared_bytes, pipelined=params["strategy"] == "pipelined", cluster=int(params["split"])))

for p in [
    {"strategy": "smem", "block": 256, "vec": 8, "split": 8, "welford": 1},
    {"strategy": "smem", "block": 512, "vec": 8, "split": 8, "welford": 0},
    {"strategy": "smem", "block": 256, "vec": 8, "split": 8, "welford": 0},
    {"strategy": "registers", "block": 1024, "vec": 8, "split": 8, "welford": 1},
    {"strategy": "reread", "block": 1024, "vec": 8, "split": 8, "welford": 0},
    {"strategy": "reread", "block": 512, "vec": 8, "split": 8, "welford": 1},
    {"strategy": "reread", "block": 512, "vec": 8, "split": 1, "welford": 1},
    {"strategy": "pipelined", "block": 256, "vec": 8, "split": 8, "welford": 0},
]:
    template(p)

tma_src = open("exp/gn_tma.cu").read()
def tma(S, block, stages, tma_store, stcs, minb, clusters):
    slice_bytes = (C // G) * H * W * 2 // S
    total = N * G
    nclusters = total if clusters is None else clusters
    variants.append(dict(name=f"tma S={S} block={block} stages={stages} tma_store={tma_store} stcs={stcs} minb={minb} clusters={nclusters}",
                         src=tma_src, defines=[f"-DS={S}", f"-DBLOCK={block}", f"-DSTAGES={stages}", f"-DTMA_STORE={tma_store}",
                                               f"-DSTCS={stcs}", f"-DMINB={minb}"],
                         entry="gn_tma", grid=nclusters * S, block=block, smem=stages * slice_bytes, tma=True, cluster=S))

for S, minb in ((8, 3), (16, 6)):
    for block in (256, 512):
        for ts, st in ((0, 0), (0, 1), (1, 0)):
            if block * minb > 2048: continue
            tma(S, block, 1, ts, st, minb, None)
# persistent rings
for S in (8, 16):
    for stages in (2, 3):
        if (C // G) * H * W * 2 // S * stages > 220 * 1024: continue
        for ts in (0, 1):
            for per_gpc in (1, 2):
                clusters = 8 * (16 // S) * per_gpc if S == 8 else 8 * per_gpc
                tma(S, 256, stages, ts, 0, 1, clusters)
# non-persistent-but-2-stage is same as persistent with clusters=total/2
tma(16, 256, 2, 1, 0, 3, 128)
tma(8, 256, 2, 1, 0, 1, 128)

def build(i):
    v = variants[i]
    path = f"{work}/k{i}.cu"; open(path, "w").write(v["src"])
    out = f"{work}/k{i}.cubin"
    r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-Xptxas", "-v", *v["defines"], path, "-o", out], capture_output=True, text=True)
    v["ptxas"] = " ".join(l.split("info    :")[-1].strip() for l in r.stderr.splitlines() if "Used" in l or "spill" in l)
    v["cubin"] = out if r.returncode == 0 else None
    if r.returncode: v["error"] = r.stderr[-800:]
only = [a for a in sys.argv if a.startswith("--only=")]
if only:
    keep = [int(i) for i in only[0][7:].split(",")]
    variants = [variants[i] for i in keep]
with ThreadPoolExecutor(16) as ex: list(ex.map(build, range(len(variants))))

torch.manual_seed(0)
x = torch.randn(N, C, H, W, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
gamma = (torch.rand(C, device="cuda") + 0.5).bfloat16()
beta = torch.randn(C, device="cuda").bfloat16()
ref = torch.nn.functional.group_norm(x.float(), G, gamma.float(), beta.float(), 1e-5)
xr = x.float().reshape(N, G, -1)
ref_mean = xr.mean(-1).reshape(-1); ref_rstd = torch.rsqrt(xr.var(-1, unbiased=False) + 1e-5).reshape(-1)
y = torch.empty_like(x); mean = torch.empty(N * G, device="cuda", dtype=torch.bfloat16); rstd = torch.empty_like(mean)
flush = cp.empty(256 * 1024 * 1024, dtype=cp.uint8)
ptr = lambda t: np.uint64(t.data_ptr())
i32 = np.int32
copy_gbps = float(os.environ.get("COPY_GBPS", "4195"))
nbytes = 2 * x.numel() * 2
results = []
ncu_mode = "--ncu" in sys.argv
for v in variants:
    if not v.get("cubin"):
        results.append(dict(name=v["name"], error=v.get("error", "?"))); print(v["name"], "BUILD FAILED", v.get("error","")[-300:], flush=True); continue
    try:
        mod = cp.RawModule(path=v["cubin"])
        fn = mod.get_function(v["entry"])
        if v["smem"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = v["smem"]
        if v["cluster"] > 8:
            kptr = fn.kernel.ptr if hasattr(fn, "kernel") else fn._kernel.ptr
            cp.cuda.driver.funcSetAttribute(kptr, int(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED), 1)
        if v.get("tma"):
            args = (ptr(x), ptr(gamma), ptr(beta), ptr(y), ptr(mean), ptr(rstd), i32(C), i32(H * W), i32(G), i32(N * G))
        else:
            args = (ptr(x), ptr(gamma), ptr(beta), ptr(y), ptr(mean), ptr(rstd), i32(C), i32(H * W), i32(G)) + ((i32(N),) if v["pipelined"] else ())
        launch = lambda: fn((v["grid"],), (v["block"],), args, shared_mem=v["smem"])
        y.fill_(float("nan")); mean.fill_(float("nan"))
        launch(); cp.cuda.Device().synchronize()
    except Exception as e:
        results.append(dict(name=v["name"], error=repr(e)[:300])); print(v["name"], "LAUNCH FAILED", repr(e)[:300], flush=True); continue
    err = (y.float() - ref).abs().max().item()
    merr = (mean.float() - ref_mean).abs().max().item(); rerr = ((rstd.float() - ref_rstd).abs() / ref_rstd).max().item()
    if ncu_mode:
        continue
    times = []
    for _ in range(40):
        flush.fill(0)
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(); launch(); b.record(); b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    med = float(np.median(times[5:]))
    r = dict(name=v["name"], us=med, share=nbytes / (med * 1e-6) / 1e9 / copy_gbps, err=err, mean_err=merr, rstd_rel=rerr, ptxas=v["ptxas"])
    results.append(r)
    print(f"{med:8.1f} us {r['share']*100:5.1f}%  err {err:.3g} mean {merr:.2g} rstd {rerr:.2g}  {v['name']}  [{v['ptxas']}]", flush=True)
if not ncu_mode:
    # torch eager for reference
    f = lambda: torch.nn.functional.group_norm(x, G, gamma, beta, 1e-5)
    ts = []
    for _ in range(20):
        flush.fill(0); a, b = cp.cuda.Event(), cp.cuda.Event(); a.record(); f(); b.record(); b.synchronize(); ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    print("torch eager", np.median(ts))
    json.dump(results, open(f"{OUT}/gn_exp.json", "w"), indent=1)
    timed = [(r["us"], i) for i, r in enumerate(results) if "us" in r and r["err"] < 0.1]
    best_tpl = min((t for t in timed if results[t[1]]["name"].startswith("tpl")), default=None)
    pick = sorted(timed)[:5] + ([best_tpl] if best_tpl else [])
    pick += [(0, i) for i, r in enumerate(results) if "pipelined" in r["name"]]
    open(f"{OUT}/gn_pick.txt", "w").write(",".join(str(i) for _, i in pick))
    print("ncu picks", [results[i]["name"] for _, i in pick])
