"""Experiment: the stream CSR SpMV kernel with the long rows (over LONG_ROW entries) taken out of the row blocks and done
first, by the first wave of blocks (the blocks resident at the launch's start), each over its slice of all the rows;
against the template's stream kernels and cuSPARSE on the suite's 2^22-row fp32 card."""
import math, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, os.getcwd())
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates.sparse import SparseTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
tk = task("spmv_csr")
spec = cards.spec(tk, "float32", 2**26, beyond=True)
tpl = SparseTemplate()
base = {"strategy": "stream", "tpr": 1, "rpb": 512, "unroll": 1, "block": 1024, "items": 8, "vec": 4, "hint": "stream", "minb": 2, "cluster": 2}
TILES_START = "    const int lane = threadIdx.x & 31;\n"
TILES_END = "    for (int i = threadIdx.x; i < n; i += BLOCK) {\n        y[r0 + i] = from_f(acc[i]);\n    }\n}\n"
KERNEL_START = 'extern "C" __global__'


def long_rows(src: str, p: dict, long_row: int) -> str:
    nrows = spec.sizes["nrows"]
    wave = 132 * p["minb"]
    scan = math.ceil(math.ceil(nrows / wave) / p["block"])
    assert scan <= 32, scan
    head = src[: src.index(KERNEL_START)]
    tiles = src[src.index(TILES_START) : src.index(TILES_END)]
    bounds = src[src.index("__launch_bounds__") : src.index(" kf_spmv_csr(")]
    rows_in = src[src.index("    for (int i = threadIdx.x; i <= n; i += BLOCK) {") : src.index("    const int first = rp[0];")]
    return head + f"""#define LONG_ROW {long_row}  // rows of more entries are done by the first wave
#define FIRST_WAVE {wave}  // the blocks resident at the launch's start
#define SCAN_K {scan}  // consecutive rows a thread checks in a first-wave block's slice

// The tiles of entries [first, last) of the n rows at rp (stream's loop).
__device__ __forceinline__ void tiles(const T* __restrict__ values, const int* __restrict__ col_idx,
    const T* __restrict__ x, const int* rp, int n, float* acc, float* prod, int first, int last) {{
{tiles}}}

extern "C" __global__ void {bounds} kf_spmv_csr(const T* __restrict__ values, const int* __restrict__ col_idx,
    const int* __restrict__ row_ptr, const T* __restrict__ x, T* __restrict__ y, int nrows) {{
    __shared__ int rp[RPB + 1];
    __shared__ float acc[RPB];
    __shared__ float prod[SKEW(TILE - 1) + 1];
    __shared__ int next;
    if (blockIdx.x < FIRST_WAVE) {{  // the long rows of this block's slice of all rows, lowest first
        const int s0 = (int)((long long)nrows * blockIdx.x / FIRST_WAVE);
        const int s1 = (int)((long long)nrows * (blockIdx.x + 1) / FIRST_WAVE);
        for (int base = s0; base < s1; base += BLOCK * SCAN_K) {{
            const int mine = base + threadIdx.x * SCAN_K;
            unsigned flags = 0;
            if (mine < s1) {{
                int prev = row_ptr[mine];
#pragma unroll 4
                for (int k = 0; k < SCAN_K; ++k) {{
                    if (mine + k < s1) {{
                        const int end = row_ptr[mine + k + 1];
                        if (end - prev > LONG_ROW) {{
                            flags |= 1u << k;
                        }}
                        prev = end;
                    }}
                }}
            }}
            for (;;) {{
                if (threadIdx.x == 0) {{
                    next = 0x7fffffff;
                }}
                __syncthreads();
                if (flags) {{
                    atomicMin(&next, mine + __ffs(flags) - 1);
                }}
                __syncthreads();
                const int r = next;
                if (r == 0x7fffffff) {{
                    break;
                }}
                if (flags && mine + __ffs(flags) - 1 == r) {{
                    flags &= flags - 1;
                }}
                if (threadIdx.x == 0) {{
                    rp[0] = row_ptr[r];
                    rp[1] = row_ptr[r + 1];
                    acc[0] = 0.0f;
                }}
                __syncthreads();
                tiles(values, col_idx, x, rp, 1, acc, prod, rp[0], rp[1]);
                if (threadIdx.x == 0) {{
                    y[r] = from_f(acc[0]);
                }}
                __syncthreads();
            }}
        }}
    }}
    const int r0 = blockIdx.x * RPB;
    const int n = min(RPB, nrows - r0);
{rows_in}    int cur = rp[0];
    int after = -1;  // the last long row passed
    for (;;) {{  // the segments between the block's long rows
        if (threadIdx.x == 0) {{
            next = n;
        }}
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += BLOCK) {{
            if (i > after && rp[i + 1] - rp[i] > LONG_ROW) {{
                atomicMin(&next, i);
            }}
        }}
        __syncthreads();
        const int stop_row = next;
        const int stop = rp[stop_row];
        if (cur < stop) {{
            tiles(values, col_idx, x, rp, n, acc, prod, cur, stop);
        }}
        if (stop_row == n) {{
            break;
        }}
        cur = rp[stop_row + 1];
        after = stop_row;
        __syncthreads();
    }}
    for (int i = threadIdx.x; i < n; i += BLOCK) {{
        if (rp[i + 1] - rp[i] <= LONG_ROW) {{
            y[r0 + i] = from_f(acc[i]);
        }}
    }}
}}
"""


configs = []
for p in ({}, {"block": 512, "items": 8, "minb": 4}, {"block": 512, "items": 16, "minb": 2}, {"block": 256, "items": 16, "rpb": 256, "minb": 4}):
    q = {**base, **p}
    label = " ".join(f"{k}{v}" for k, v in p.items())
    configs.append(("stream " + label, q, None))
    for long_row in (4096, 8192, 16384):
        configs.append((f"long>{long_row} " + label, q, long_row))


def render(item):
    name, p, long_row = item
    src, plan = tpl.render(spec, tpl.canonical(spec, p))
    if long_row is not None:
        src = long_rows(src, p, long_row)
    return name, src, plan


if __name__ == "__main__":
    import numpy as np, cupy as cp, torch
    rendered = [render(c) for c in configs]
    def build(item):
        i, (name, src, plan) = item
        path = f"/tmp/long_{i}.cu"; open(path, "w").write(src)
        r = subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-Xptxas", "-v", path, "-o", path + ".cubin"], capture_output=True, text=True)
        regs = [l.strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l]
        return name, plan, (path + ".cubin" if r.returncode == 0 else None), r.stderr[-800:] if r.returncode else " | ".join(regs)
    with ThreadPoolExecutor(16) as ex: built = list(ex.map(build, enumerate(rendered)))
    d = tk.draw(spec.sizes, "float32", 1)
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
