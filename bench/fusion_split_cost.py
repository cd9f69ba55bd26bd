"""Benchmark (not a test): what splitting an Inductor fusion costs on this GPU, against the compile pass's estimate
(`kernelforge_tui.cast.fusion_cost`: the intermediate's round trip at SPLIT_SHARE of the copy ceiling).

Two splits a package kernel makes when it replaces one node of a fused neighbourhood: after a producer (the scale and
mask before a softmax: the scaled logits written, then read by the softmax) and before a consumer (the SiLU after a
group norm). Each chain is compiled whole, then as its two halves, and timed back to back (median of rounds of
CUDA-event means, interleaved, no L2 flush: a model's layers run back to back; `cast_gpu.time_modes`).

    python bench/fusion_split_cost.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cast_gpu import Part, time_modes

from kernelforge_tui.cast.fusion_cost import SPLIT_SHARE
from kernelforge_tui.cast.probe import copy_gbps


def case(
    name: str,
    fused: Callable[..., Any],
    first: Callable[..., Any],
    then: Callable[..., Any],
    args: tuple[Any, ...],
    ceiling_gbps: float,
) -> None:
    with torch.no_grad():
        whole, head, tail = torch.compile(fused), torch.compile(first), torch.compile(then)
        intermediate = head(*args)
        parts: dict[str, Part] = {
            "fused": (lambda: whole(*args), None),
            "split": (lambda: tail(head(*args)), None),
            "alone": (lambda: tail(intermediate), None),
        }
        timed = time_modes(parts, rounds=15, per_round=20)
    fused_us, split_us, alone_us = (timed[name]["back_to_back"]["median_us"] for name in ("fused", "split", "alone"))
    round_trip = 2 * intermediate.numel() * intermediate.element_size()
    estimate = round_trip / (SPLIT_SHARE * ceiling_gbps * 1e3)
    print(
        f"{name}: fused {fused_us:.1f} us, split {split_us:.1f} us (second kernel alone {alone_us:.1f}): measured "
        f"split cost {split_us - fused_us:.1f} us; the pass's estimate {estimate:.1f} us ({round_trip / 1e6:.1f} MB "
        f"at {SPLIT_SHARE:g} of the {ceiling_gbps:.0f} GB/s copy ceiling); at the full ceiling "
        f"{round_trip / (ceiling_gbps * 1e3):.1f} us"
    )


def main() -> None:
    torch.manual_seed(0)
    bf = torch.bfloat16
    ceiling = copy_gbps()
    x = torch.randn(2, 16, 1024, 1024, device="cuda", dtype=bf)
    mask = torch.full((1024, 1024), float("-inf"), device="cuda", dtype=bf).triu(1)
    case(
        "scale+mask+softmax [2,16,1024,1024] bf16 (producer split)",
        lambda x, m: torch.softmax(x / 8 + m, -1),
        lambda x, m: x / 8 + m,
        lambda y: torch.softmax(y, -1),
        (x, mask),
        ceiling,
    )
    g = torch.randn(4, 512, 64, 64, device="cuda", dtype=bf)
    w, b = torch.randn(512, device="cuda", dtype=bf), torch.randn(512, device="cuda", dtype=bf)
    case(
        "group_norm+silu [4,512,64,64] bf16 (consumer split)",
        lambda g: F.silu(F.group_norm(g, 32, w, b)),
        lambda g: F.group_norm(g, 32, w, b),
        F.silu,
        (g,),
        ceiling,
    )
    print(torch.cuda.get_device_name(), torch.__version__)


if __name__ == "__main__":
    main()
