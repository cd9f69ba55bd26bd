"""Benchmark (not a test): the tensor-core attention template against torch's scaled_dot_product_attention (its
flash, cuDNN or memory-efficient kernel, whichever torch picks) at a Hugging Face Llama layer's and a ViT-B/16's
shapes, bf16.

Two steps, so that the GPU machine spends its time timing, not compiling:

    python bench/attention_mma.py build out/attention_cubins            # here: renders and builds every seed
    python bench/attention_mma.py run out/attention_cubins --out OUT    # on the H200: proves and times them

`build` renders the template (proposers/templates/attention_mma.py) for the card of each case below (as capture makes
it of a scaled_dot_product_attention: `card_of`) with each of its seeds (bench/cubins.py). `run` launches each as
the worker does and, per case, checks its output against an fp32 attention of the same bf16 inputs (beside torch's
own bf16 output) and times it against torch's, interleaved, the L2 flushed before each launch. Writes
OUT/attention_mma.json and OUT/attention_mma.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import cubins as bench

CASES: list[dict[str, Any]] = [
    # bench/zoo_models.py's Llama (32 heads of 128, 2 x 1024 tokens, causal), q, k, v projected as [b, s, h, d]
    {"name": "llama", "batch": 2, "heads": 32, "seq": 1024, "d": 128, "causal": True, "seq_first": True},
    # timm's ViT-B/16 at batch 32: 197 tokens, 12 heads of 64
    {"name": "vit", "batch": 32, "heads": 12, "seq": 197, "d": 64, "causal": False, "seq_first": False},
    {"name": "long_causal", "batch": 1, "heads": 16, "seq": 4096, "d": 128, "causal": True, "seq_first": False},
]


def card_of(case: dict[str, Any]) -> Any:
    """The card capture makes of the case's attention: q, k, v and y in the order they lie in memory ([b, s, h, d]
    projections seen as [b, h, s, d] for `seq_first`), the call its reference replays, scale 1/sqrt(d)."""
    from kernelforge_tui.capture.families import ATTENTION_REPLAY
    from kernelforge_tui.cards.model import OperatorCard

    seq, d = case["seq"], case["d"]
    sizes = {"batch": case["batch"], "heads": case["heads"], "sq": seq, "sk": seq, "d": d, "dv": d}
    lead = ["batch", "{seq}", "heads"] if case["seq_first"] else ["batch", "heads", "{seq}"]

    def tensor(name: str, seq: str, dim: str) -> dict[str, Any]:
        return {"name": name, "dtype": "bfloat16", "shape": [seq if n == "{seq}" else n for n in lead] + [dim]}

    scalars = {"args[3]": 0.0, "args[4]": case["causal"], "kwargs.scale": d**-0.5}
    return OperatorCard.model_validate(
        {
            "name": f"attention_{case['name']}",
            "family": "attention",
            "sizes": sizes,
            "inputs": [tensor("q", "sq", "d"), tensor("k", "sk", "d"), tensor("v", "sk", "dv")],
            "outputs": [{"name": "y", "dtype": "bfloat16", "shape": ["batch", "heads", "sq", "dv"]}],
            "input_sets": [{"name": "seed_1", "seed": 1}],
            "reference": {"kind": "numpy", "function": "reference.py:reference"},
            "call": {
                "op": ATTENTION_REPLAY,
                "args": [{"path": f"args[{i}]", "kind": "input", "input": n} for i, n in enumerate("qkv")]
                + [{"path": path, "kind": "scalar", "value": value} for path, value in scalars.items()],
            },
        }
    )


def build(out: Path, variants: list[dict[str, Any]] | None = None, one_at_a_time: bool = False) -> None:
    """Render and build every case's seeds, or `variants` (each a change to the first seed)."""
    from kernelforge_tui.proposers.templates.attention_mma import AttentionMmaTemplate

    bench.build(out, "kf_attention", CASES, card_of, [AttentionMmaTemplate()], variants, one_at_a_time)


def run(cubins: Path, out: Path) -> None:
    import torch
    import torch.nn.functional as F

    loaded = bench.Cubins(cubins, "kf_attention")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for case in loaded.manifest["cases"]:
        b, h, s, d = case["batch"], case["heads"], case["seq"], case["d"]
        shape = (b, s, h, d) if case["seq_first"] else (b, h, s, d)
        stored = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        q, k, v = (t.transpose(1, 2) if case["seq_first"] else t for t in stored)  # [b, h, s, d] views

        def vendor(q: Any = q, k: Any = k, v: Any = v, causal: bool = case["causal"]) -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=case["causal"])
        error = bench.error_against(ref)
        y = torch.empty(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        rows, launchers = loaded.proven(case["name"], {"q": stored[0], "k": stored[1], "v": stored[2], "y": y}, error)
        times = loaded.interleaved({"torch": vendor, **launchers})
        flops = 4 * b * h * s * s * d // (2 if case["causal"] else 1)
        best = bench.timed_rows(rows, times, flops)
        torch_time = {**bench.summary(times["torch"], flops), **error(vendor())}
        entry = {
            "case": case,
            "flops": flops,
            "torch": torch_time,
            "variants": rows,
            "best": best["config"],
            "best_pct_of_torch": 100 * torch_time["median_us"] / best["median_us"],
        }
        report["cases"].append(entry)
        print(json.dumps({k: entry[k] for k in entry if k != "variants"} | {"best_row": best}), flush=True)
    loaded.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_mma.json").write_text(json.dumps(report, indent=1))
    (out / "attention_mma.md").write_text(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Tensor-core attention template vs torch's SDPA ({report['device']}, torch {report['torch']})",
        "",
        f"bf16 in and out, fp32 sums; L2 flushed before every launch; median of {bench.REPS} interleaved launches.",
        "",
        "| case | shape | torch us | best config | ours us | % of torch | ours TFLOP/s | max err / rms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in report["cases"]:
        case, vendor = entry["case"], entry["torch"]
        best = next(r for r in entry["variants"] if r["config"] == entry["best"])
        shape = f"{case['batch']}x{case['heads']}x{case['seq']}x{case['d']}{' causal' if case['causal'] else ''}"
        lines.append(
            f"| {case['name']} | {shape} | {vendor['median_us']:.1f} | {entry['best']} | {best['median_us']:.1f} | "
            f"{entry['best_pct_of_torch']:.0f}% | {best['tflops']:.0f} | {best['max_error_over_rms']:.2g} "
            f"(torch {vendor['max_error_over_rms']:.2g}) |"
        )
    lines += bench.configurations(report)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    bench.main(__doc__ or "", build, run, Path("out/attention_mma"))
