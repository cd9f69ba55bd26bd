"""Benchmark (not a test): the CUTLASS Hopper GEMM template against cuBLAS (torch) at the example decoder's shapes.

Two steps, so that the GPU machine spends its time timing, not compiling:

    python bench/gemm_cutlass.py build out/gemm_cubins          # here: renders and builds every variant (sandboxed)
    python bench/gemm_cutlass.py build out/more --variants v.json  # or other changes to the first seed
    python bench/gemm_cutlass.py run out/gemm_cubins --out OUT  # on the H200: proves and times them

`build` renders the template (proposers/templates/gemm_sm90.py) for the cards of each case below with each of its
seed configurations (TMA mainloops, alone and in clusters of two, and the cp.async mainloop's best) and builds them
with the product's Builder (the sandbox, the CUTLASS include root, sm_90a), writing the cubins and manifest.json
(each variant's resolved launch: grid, block, and its arguments, tensor maps included). `run` loads each cubin
into torch's CUDA context with pycuda, launches it as the worker does (the parameter buffer laid out by
`tensor_maps.struct_format`, each map encoded by `tensor_maps.encode` over the torch tensor launched on) and, per
case:
- checks every configuration's output against an fp32 product of the same bf16 inputs (torch, on the GPU), beside
  cuBLAS's own bf16 output against the same reference: the largest error over the reference's RMS, and the share of
  elements outside rtol 1.6e-2 (bf16's assert_close default) with atol 1e-2 x that RMS;
- times each configuration and cuBLAS (torch.mm / torch.bmm / F.linear with the layout the model uses), interleaved
  launch by launch, CUDA events around each launch, the L2 flushed (a 256 MiB memset) before each, and reports the
  median, the spread and TFLOP/s, and the best configuration as a percentage of cuBLAS's speed.
The fused case (bias + GELU) is also timed against cuBLAS followed by the separate GELU (F.gelu(F.linear(x, w, b))),
and with `--max-autotune` against torch.compile(mode="max-autotune") of that chain (issue 32's epilogue goal).
Writes OUT/gemm_cutlass.json and OUT/gemm_cutlass.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import cubins as bench

CASES: list[dict[str, Any]] = [
    # name, sizes, a dims, b dims, bias; the decoder's projections read nn.Linear's weight [N, K] as b^T
    {"name": "mm_qkvo", "what": "x @ W^T, q/k/v/o projections", "M": 2048, "N": 2048, "K": 2048, "b": "NK"},
    {"name": "mm_gate_up", "what": "x @ W^T, gate and up", "M": 2048, "N": 5632, "K": 2048, "b": "NK"},
    {"name": "mm_down", "what": "h @ W^T, down", "M": 2048, "N": 2048, "K": 5632, "b": "NK"},
    {"name": "bmm_scores", "what": "q @ k^T, 32 heads", "batch": 32, "M": 1024, "N": 1024, "K": 128, "b": "NK"},
    {"name": "bmm_values", "what": "p @ v, 32 heads", "batch": 32, "M": 1024, "N": 128, "K": 1024, "b": "KN"},
    {"name": "mm_tails", "what": "tails in M, N and K", "M": 2000, "N": 1032, "K": 1000, "b": "NK"},
    {"name": "linear_gelu", "what": "gelu(x @ W^T + bias)", "M": 2048, "N": 5632, "K": 2048, "b": "NK", "bias": True},
]


MAX_AUTOTUNE = "run: also time torch.compile(mode='max-autotune') of the fused case's chain (minutes of autotuning)"


def card_of(case: dict[str, Any]) -> Any:
    from kernelforge_tui.cards.model import OperatorCard

    lead = ["batch"] if "batch" in case else []
    sizes = {k: case[k] for k in ("batch", "M", "N", "K") if k in case}
    b = ["N", "K"] if case["b"] == "NK" else ["K", "N"]
    inputs = [
        {"name": "a", "dtype": "bfloat16", "shape": [*lead, "M", "K"]},
        {"name": "b", "dtype": "bfloat16", "shape": [*lead, *b]},
    ]
    if case.get("bias"):
        inputs.append({"name": "bias", "dtype": "bfloat16", "shape": ["N"]})
    return OperatorCard.model_validate(
        {
            "name": f"{case['name']}_bf16",
            "family": "matmul",
            "sizes": sizes,
            "inputs": inputs,
            "outputs": [{"name": "y", "dtype": "bfloat16", "shape": [*lead, "M", "N"]}],
            "input_sets": [{"name": "seed_1", "seed": 1}],
            "reference": {"kind": "numpy", "function": "reference.py:reference"},
        }
    )


def build(out: Path, variants: list[dict[str, Any]] | None = None, one_at_a_time: bool = False) -> None:
    """Render and build every case's seed configurations, or `variants` (each a change to the first seed)."""
    from kernelforge_tui.proposers.templates.gemm_sm90 import GemmSm90Template

    bench.build(out, "kf_gemm", CASES, card_of, [GemmSm90Template()], variants, one_at_a_time)


def run(cubins: Path, out: Path, max_autotune: bool = False) -> None:
    import torch
    import torch.nn.functional as F

    loaded = bench.Cubins(cubins, "kf_gemm")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for case in loaded.manifest["cases"]:
        lead = [case["batch"]] if "batch" in case else []
        m, n, k = case["M"], case["N"], case["K"]
        a = torch.randn(*lead, m, k, device="cuda", dtype=torch.bfloat16)
        b_shape = [*lead, n, k] if case["b"] == "NK" else [*lead, k, n]
        b = torch.randn(*b_shape, device="cuda", dtype=torch.bfloat16) / k**0.5
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if case.get("bias") else None
        b_op = b.transpose(-1, -2) if case["b"] == "NK" else b  # the [K, N] operand the product reads

        def vendor(a: Any = a, b: Any = b, b_op: Any = b_op, bias: Any = bias, case: dict[str, Any] = case) -> Any:
            if case.get("bias"):
                return F.linear(a, b, bias)  # cuBLAS's addmm with the bias in its epilogue
            return torch.bmm(a, b_op) if "batch" in case else torch.mm(a, b_op)

        def reference(a: Any = a, b_op: Any = b_op, bias: Any = bias, case: dict[str, Any] = case) -> Any:
            y = torch.matmul(a.float(), b_op.float())
            if bias is not None:
                y = F.gelu(y + bias.float())
            return y

        def chain(a: Any, b: Any, bias: Any) -> Any:  # the fused case's chain, as the model runs it
            return F.gelu(F.linear(a, b, bias))

        fused_vendor = (lambda a=a, b=b, bias=bias: chain(a, b, bias)) if case.get("bias") else vendor
        ref = reference()
        error = bench.error_against(ref)

        y = torch.empty(*lead, m, n, device="cuda", dtype=torch.bfloat16)
        rows, launchers = loaded.proven(case["name"], {"a": a, "b": b, "bias": bias, "y": y}, error)
        vendor_error = error(fused_vendor())
        calls = {"cuBLAS": vendor, **({"cuBLAS + gelu": fused_vendor} if case.get("bias") else {}), **launchers}
        if max_autotune and case.get("bias"):  # Inductor's best for the chain: its GEMM choice with the GELU fused
            compiled = torch.compile(chain, mode="max-autotune")
            calls["compile max-autotune"] = lambda a=a, b=b, bias=bias, f=compiled: f(a, b, bias)
        times = loaded.interleaved(calls)
        flops = 2 * m * n * k * (lead[0] if lead else 1)
        best = bench.timed_rows(rows, times, flops)
        vendor_time = bench.summary(times["cuBLAS"], flops)
        entry = {
            "case": case,
            "flops": flops,
            "cuBLAS": {**vendor_time, **vendor_error},
            "variants": rows,
            "best": best["config"],
            "best_pct_of_cublas": 100 * vendor_time["median_us"] / best["median_us"],
        }
        if case.get("bias"):
            entry["cuBLAS + gelu"] = {**bench.summary(times["cuBLAS + gelu"], flops), **vendor_error}
            entry["best_pct_of_cublas_plus_gelu"] = 100 * entry["cuBLAS + gelu"]["median_us"] / best["median_us"]
        if "compile max-autotune" in calls:
            tuned = calls["compile max-autotune"]
            autotuned = {**bench.summary(times["compile max-autotune"], flops), **error(tuned())}
            entry["compile max-autotune"] = autotuned
            entry["best_pct_of_max_autotune"] = 100 * autotuned["median_us"] / best["median_us"]
        report["cases"].append(entry)
        print(json.dumps({k: entry[k] for k in entry if k != "variants"} | {"best_row": best}), flush=True)
    loaded.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_cutlass.json").write_text(json.dumps(report, indent=1))
    (out / "gemm_cutlass.md").write_text(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# CUTLASS GEMM template vs cuBLAS ({report['device']}, torch {report['torch']})",
        "",
        f"bf16 in and out, fp32 sums; L2 flushed before every launch; median of {bench.REPS} interleaved launches.",
        "",
        "| case | shape | cuBLAS us | best config | ours us | % of cuBLAS | ours TFLOP/s | max err / rms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in report["cases"]:
        case = entry["case"]
        best = next(r for r in entry["variants"] if r["config"] == entry["best"])
        shape = f"{case.get('batch', 1)}x{case['M']}x{case['N']}x{case['K']} b {case['b']}"
        lines.append(
            f"| {case['name']} | {shape} | {entry['cuBLAS']['median_us']:.1f} | {entry['best']} | "
            f"{best['median_us']:.1f} | {entry['best_pct_of_cublas']:.0f}% | {best['tflops']:.0f} | "
            f"{best['max_error_over_rms']:.2g} (cuBLAS {entry['cuBLAS']['max_error_over_rms']:.2g}) |"
        )
        if "compile max-autotune" in entry:
            autotuned = entry["compile max-autotune"]["median_us"]
            lines.append(
                f"| {case['name']} vs torch.compile max-autotune | | {autotuned:.1f} | | | "
                f"{entry['best_pct_of_max_autotune']:.0f}% | | |"
            )
        if "cuBLAS + gelu" in entry:
            lines.append(
                f"| {case['name']} vs cuBLAS + separate gelu | | {entry['cuBLAS + gelu']['median_us']:.1f} | | | "
                f"{entry['best_pct_of_cublas_plus_gelu']:.0f}% | | |"
            )
    lines += bench.configurations(report)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    bench.main(__doc__ or "", build, run, Path("out/gemm_cutlass"), max_autotune=MAX_AUTOTUNE)
