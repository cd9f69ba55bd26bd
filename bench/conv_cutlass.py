"""Benchmark (not a test): the implicit-GEMM convolution templates, Hopper's (conv_sm90: CUTLASS 3.x wgmma, stride 1)
and CUTLASS 2.x's (conv_igemm), against cuDNN (torch) at the example diffusion block's 3x3 convolution and at
ResNet-50's, channels-last, bf16.

Two steps, so that the GPU machine spends its time timing, not compiling:

    python bench/conv_cutlass.py build out/conv_cubins              # here: renders and builds every variant
    python bench/conv_cutlass.py build out/more --variants v.json   # or other changes to the first seed
    python bench/conv_cutlass.py run out/conv_cubins --out OUT      # on the H200: proves and times them

`build` renders each template (proposers/templates/conv_sm90.py, conv_igemm.py) that serves the card of a case
below (as capture makes it of a channels-last aten.convolution: `card_of`) with each of its seeds and builds them
with the product's Builder (bench/cubins.py). `run` launches each as the worker does and, per case:
- checks every configuration's output against an fp32 convolution of the same bf16 inputs (torch, TF32 off), beside
  cuDNN's own bf16 output: the largest error over the reference's RMS, and the share of elements outside rtol 1.6e-2
  with atol 1e-2 x that RMS;
- times each configuration and cuDNN (F.conv2d on the channels-last tensors, and for the diffusion block's case also
  on NCHW ones, the layout the block runs in), interleaved launch by launch, the L2 flushed before each, and reports
  the median, the spread and TFLOP/s, and the best configuration as a percentage of cuDNN's speed.
Writes OUT/conv_cutlass.json and OUT/conv_cutlass.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import cubins as bench

CASES: list[dict[str, Any]] = [
    # the diffusion block's conv1 and conv2 (examples/models/diffusion_block.py, "full")
    {"name": "diffusion_3x3", "n": 4, "c": 512, "h": 64, "w": 64, "o": 512, "k": 3, "stride": 1, "pad": 1},
    # ResNet-50 at batch 32 (bench/zoo_models.py): each stage's 3x3, the strided 3x3 that opens stage 2, a 1x1
    {"name": "resnet_s1_3x3", "n": 32, "c": 64, "h": 56, "w": 56, "o": 64, "k": 3, "stride": 1, "pad": 1},
    {"name": "resnet_s2_3x3", "n": 32, "c": 128, "h": 28, "w": 28, "o": 128, "k": 3, "stride": 1, "pad": 1},
    {"name": "resnet_s3_3x3", "n": 32, "c": 256, "h": 14, "w": 14, "o": 256, "k": 3, "stride": 1, "pad": 1},
    {"name": "resnet_s2_3x3_stride2", "n": 32, "c": 128, "h": 56, "w": 56, "o": 128, "k": 3, "stride": 2, "pad": 1},
    {"name": "resnet_s1_1x1", "n": 32, "c": 256, "h": 56, "w": 56, "o": 64, "k": 1, "stride": 1, "pad": 0},
    {"name": "tails", "n": 3, "c": 40, "h": 19, "w": 21, "o": 72, "k": 3, "stride": 1, "pad": 1, "bias": True},
]


def out_size(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def card_of(case: dict[str, Any], dtype: str = "bfloat16") -> Any:
    """The card capture makes of a channels-last aten.convolution of the case's geometry (dilation 1, groups 1):
    every tensor as it lies in memory, and the call with its scalars."""
    from kernelforge_tui.cards.model import OperatorCard

    oh, ow = (out_size(case[d], case["k"], case["stride"], case["pad"]) for d in ("h", "w"))
    sizes = {"n": case["n"], "c": case["c"], "h": case["h"], "w": case["w"], "o": case["o"], "cg": case["c"]}
    sizes.update(kh=case["k"], kw=case["k"], oh=oh, ow=ow, groups=1)
    inputs = [
        {"name": "x", "dtype": dtype, "shape": ["n", "h", "w", "c"]},
        {"name": "weight", "dtype": dtype, "shape": ["o", "kh", "kw", "cg"]},
    ]
    args: list[dict[str, Any]] = [
        {"path": "args[0]", "kind": "input", "input": "x"},
        {"path": "args[1]", "kind": "input", "input": "weight"},
        {"path": "args[2]", "kind": "none"},
    ]
    if case.get("bias"):
        inputs.append({"name": "bias", "dtype": dtype, "shape": ["o"]})
        args[2] = {"path": "args[2]", "kind": "input", "input": "bias"}
    scalars = [[case["stride"]] * 2, [case["pad"]] * 2, [1, 1], False, [0, 0], 1]
    args += [{"path": f"args[{3 + i}]", "kind": "scalar", "value": v} for i, v in enumerate(scalars)]
    return OperatorCard.model_validate(
        {
            "name": f"conv2d_{case['name']}",
            "family": "convolution",
            "sizes": sizes,
            "inputs": inputs,
            "outputs": [{"name": "y", "dtype": dtype, "shape": ["n", "oh", "ow", "o"]}],
            "input_sets": [{"name": "seed_1", "seed": 1}],
            "reference": {"kind": "numpy", "function": "reference.py:reference"},
            "call": {"op": "aten.convolution.default", "args": args},
        }
    )


def build(out: Path, variants: list[dict[str, Any]] | None = None, one_at_a_time: bool = False) -> None:
    """Render and build every case's seed configurations, or `variants` (each a change to the first seed)."""
    from kernelforge_tui.proposers.templates.conv_igemm import ConvIgemmTemplate
    from kernelforge_tui.proposers.templates.conv_sm90 import ConvSm90Template

    templates = [ConvSm90Template(), ConvIgemmTemplate()]
    bench.build(out, "kf_conv", CASES, card_of, templates, variants, one_at_a_time)


def run(cubins: Path, out: Path) -> None:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True  # cuDNN's best algorithm for each shape, as a tuned model runs
    torch.backends.cudnn.allow_tf32 = False  # the fp32 reference exact to fp32
    loaded = bench.Cubins(cubins, "kf_conv")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    last = torch.channels_last
    for case in loaded.manifest["cases"]:
        n, c, h, w, o, k = (case[key] for key in ("n", "c", "h", "w", "o", "k"))
        x = torch.randn(n, c, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=last)
        weight = (torch.randn(o, c, k, k, device="cuda", dtype=torch.bfloat16) / (c * k * k) ** 0.5).contiguous(
            memory_format=last
        )
        bias = torch.randn(o, device="cuda", dtype=torch.bfloat16) if case.get("bias") else None
        geometry = {"stride": case["stride"], "padding": case["pad"]}

        def vendor(x: Any = x, weight: Any = weight, bias: Any = bias, geometry: Any = geometry) -> Any:
            return F.conv2d(x, weight, bias, **geometry)

        x_nchw, w_nchw = x.contiguous(), weight.contiguous()
        ref = F.conv2d(x.float(), weight.float(), None if bias is None else bias.float(), **geometry)
        error = bench.error_against(ref)

        y = torch.empty_like(ref, dtype=torch.bfloat16).contiguous(memory_format=last)
        rows, launchers = loaded.proven(case["name"], {"x": x, "weight": weight, "bias": bias, "y": y}, error)
        calls = {"cuDNN": vendor}
        if case["name"].startswith("diffusion"):
            calls["cuDNN NCHW"] = lambda x=x_nchw, w=w_nchw, b=bias, g=geometry: F.conv2d(x, w, b, **g)
        times = loaded.interleaved({**calls, **launchers})
        flops = 2 * ref.numel() * c * k * k
        best = bench.timed_rows(rows, times, flops)
        vendors = {name: {**bench.summary(times[name], flops), **error(fn())} for name, fn in calls.items()}
        entry = {
            "case": case,
            "flops": flops,
            "vendors": vendors,
            "variants": rows,
            "best": best["config"],
            "best_pct_of_cudnn": 100 * vendors["cuDNN"]["median_us"] / best["median_us"],
        }
        report["cases"].append(entry)
        print(json.dumps({k: entry[k] for k in entry if k != "variants"} | {"best_row": best}), flush=True)
    loaded.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "conv_cutlass.json").write_text(json.dumps(report, indent=1))
    (out / "conv_cutlass.md").write_text(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Implicit-GEMM convolution templates vs cuDNN ({report['device']}, torch {report['torch']})",
        "",
        f"bf16 in and out, fp32 sums, channels-last; L2 flushed before every launch; median of {bench.REPS} "
        "interleaved launches; cuDNN with cudnn.benchmark on.",
        "",
        "| case | shape | cuDNN us | best config | ours us | % of cuDNN | ours TFLOP/s | max err / rms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in report["cases"]:
        case, cudnn = entry["case"], entry["vendors"]["cuDNN"]
        best = next(r for r in entry["variants"] if r["config"] == entry["best"])
        shape = (
            f"{case['n']}x{case['c']}x{case['h']}x{case['w']} -> {case['o']}, {case['k']}x{case['k']} s{case['stride']}"
        )
        lines.append(
            f"| {case['name']} | {shape} | {cudnn['median_us']:.1f} | {entry['best']} | {best['median_us']:.1f} | "
            f"{entry['best_pct_of_cudnn']:.0f}% | {best['tflops']:.0f} | {best['max_error_over_rms']:.2g} "
            f"(cuDNN {cudnn['max_error_over_rms']:.2g}) |"
        )
        if "cuDNN NCHW" in entry["vendors"]:
            nchw = entry["vendors"]["cuDNN NCHW"]["median_us"]
            lines.append(
                f"| {case['name']} vs cuDNN on NCHW | | {nchw:.1f} | | | {100 * nchw / best['median_us']:.0f}% | | |"
            )
    lines += bench.configurations(report)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    bench.main(__doc__ or "", build, run, Path("out/conv_cutlass"))
