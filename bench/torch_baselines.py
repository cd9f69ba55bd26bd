"""Benchmark (not a test): eager PyTorch and torch.compile on the example cards' ops, on the GPU.

Timed like our candidates (CUDA events, L2 flushed before each launch, median), and reported as a share
of the copy ceiling with the card's counted bytes, so they sit beside `kernelforge optimize` results.

    python bench/torch_baselines.py [--copy-gbps 4200] [--cards softmax_bf16_4096x32768 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernelforge_tui.cards import load_card
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import cached_ceilings

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def op_for(family: str) -> Callable[..., Any]:
    if family == "softmax":
        return lambda x: torch.softmax(x, dim=-1)
    if family == "rms_norm":
        return lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=1e-6)
    if family == "elementwise":
        return lambda a, b: a + b
    raise ValueError(family)


def median_us(fn: Callable[[], Any], reps: int = 50) -> float:
    scratch = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    for _ in range(5):
        fn()
    times = []
    for i in range(reps):
        scratch.fill_(i)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copy-gbps", type=float, help="the copy ceiling (default: the one kernelforge measured)")
    parser.add_argument("--cards", nargs="*", default=["softmax_bf16_4096x32768", "rms_norm_bf16_16384x4096",
                                                       "vector_add_f32"])  # fmt: skip
    args = parser.parse_args()
    if args.copy_gbps is None:
        measured = cached_ceilings(require_gpu()[0].uuid)
        if measured is None:
            raise SystemExit("no measured ceiling yet: run `kernelforge eval` once, or pass --copy-gbps")
        args.copy_gbps = measured.copy_gbps
    print(f"copy ceiling: {args.copy_gbps:.0f} GB/s")
    rows = []
    for name in args.cards:
        card = load_card(ROOT / "examples" / "cards" / name).spec
        tensors = [torch.randn(t.dims(card.sizes), device="cuda").to(DTYPES[t.dtype]) for t in card.inputs]
        fn = op_for(card.family)
        compiled = torch.compile(fn)
        row = {"card": name}
        for label, f in (("eager", fn), ("compile", compiled)):
            us = median_us(lambda f=f, t=tensors: f(*t))
            row[f"{label}_us"] = us
            row[f"{label}_share"] = card.bytes_moved() / (us * 1e-6) / 1e9 / args.copy_gbps
        rows.append(row)
        print(f"{name:<28} eager {row['eager_us']:9.1f} us ({row['eager_share']:.0%} of ceiling)   "
              f"compile {row['compile_us']:9.1f} us ({row['compile_share']:.0%})")  # fmt: skip
    if out := os.environ.get("OUT"):
        Path(out, "torch_baselines.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
