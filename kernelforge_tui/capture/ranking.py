"""How much time a faster kernel for a variant could save, so that the search goes where the time is.

Amdahl: a variant that takes a share s of the model's time, made k times faster, saves s * (1 - 1/k) of it.
The share is measured at capture. k is an estimate, in one of two ways, and the manifest says which:

- measured on CUDA (the copy bandwidth measured at capture): k = the variant's time per call / the time a kernel
  needs to move its card's bytes at REACHABLE of the copy ceiling, plus LAUNCH_FLOOR_US (a kernel never takes less);
  at most MAX_SPEEDUP. A tiny op that already takes the floor gets k = 1: there is nothing to save.
- otherwise (a CPU capture, whose times say nothing about a GPU kernel): a prior per family, REACHABLE over the
  share of the copy ceiling eager PyTorch reaches on the H200 for that family (../shared/device/README.md,
  measured with the same timing as our candidates), times, for a fused pattern, the bytes its separate eager calls
  move over the fused card's bytes (each call reads and writes its whole tensors).

A variant without a card cannot be improved by the product: k = 1, saving 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelforge_tui.capture.manifest import Variant, VariantStatus

REACHABLE = 0.88
"""Share of the copy ceiling the best kernels of the search reached on the H200 (softmax 88%, rms_norm 89%)."""
LAUNCH_FLOOR_US = 2.0
"""The shortest a kernel takes on a GPU, launch to end, however little it moves."""
MAX_SPEEDUP = 10.0

EAGER_SHARE = {
    "softmax": 0.52,
    "layer_norm": 0.59,
    "rms_norm": 0.76,
    "group_norm": 0.16,
    "pooling": 0.10,
    "elementwise": 0.74,
    "silu_mul": 0.27,
    "stencil": 0.12,
}
"""Eager PyTorch's share of the copy ceiling on the H200 per family (bf16; device README: softmax [4096x32768],
layer_norm and rms_norm [16384x4096], group_norm [8x512x128x128], adaptive_avg_pool2d [256x2048x7x7], gelu [2^28] for
elementwise maps, silu(gate) * up [16384x11008] measured as one fused pair)."""
OTHER_SHARE = 0.5
"""A family the device README has no measurement for (batch norm): a guess, said as such."""
MATRIX_TFLOPS = {"bfloat16": 700.0, "float16": 700.0, "float32": 50.0}
"""The matrix ceiling a matrix product's measured (cuBLAS) time is held against, per dtype: bf16 through cuBLAS at
8192^3 on the H200 (700-790 TFLOP/s, ../shared/device/README.md; fp16 taken as bf16), and fp32 without TF32 (the
H200's 67 TFLOP/s of FMA, less what cuBLAS leaves)."""


VENDORS = {"matmul": "cuBLAS", "convolution": "cuDNN", "attention": "flash attention"}
"""The families held against the matrix ceiling (tensor-core work), and the vendor library whose time eager measures
for each (attention: the flash, memory-efficient or cuDNN kernel torch's scaled_dot_product_attention chose)."""


@dataclass(frozen=True)
class Estimate:
    speedup: float
    how: str


def estimate(
    *,
    family: str | None,
    op: str,
    pattern: bool,
    per_call_us: float,
    card_bytes: int,
    eager_bytes: int,
    copy_gbps: float | None,
    card_flops: int = 0,
    dtype: str = "",
) -> Estimate:
    """k for one carded variant. `eager_bytes`: what its eager call(s) move per instance (for a pattern, every call's
    tensors; for an op, its card's bytes). A matrix product, a convolution and attention are held against the matrix
    ceiling instead (their FLOPs, `card_flops`, at MATRIX_TFLOPS of the `dtype`), or the copy ceiling where their
    bytes take longer (a depthwise convolution, a matrix-vector product)."""
    if family in VENDORS:
        tflops = MATRIX_TFLOPS.get(dtype)
        return _matrix_estimate(VENDORS[family], per_call_us, card_flops, tflops, card_bytes, copy_gbps)
    if copy_gbps is not None and copy_gbps > 0 and card_bytes > 0 and per_call_us > 0:
        ideal_us = card_bytes / (REACHABLE * copy_gbps * 1e3) + LAUNCH_FLOOR_US
        k = min(MAX_SPEEDUP, max(1.0, per_call_us / ideal_us))
        return Estimate(
            k,
            f"measured: {per_call_us:.3g} us per call against {ideal_us:.3g} us to move {card_bytes} bytes at "
            f"{REACHABLE:.0%} of the measured copy ceiling ({copy_gbps:.0f} GB/s) plus a {LAUNCH_FLOOR_US:g} us "
            "launch floor",
        )
    key = op if op in EAGER_SHARE else (family or "other")
    share = EAGER_SHARE.get(key, OTHER_SHARE)
    k = REACHABLE / share
    how = (
        f"prior: eager PyTorch reaches {share:.0%} of the copy ceiling for {key} on the H200, good kernels "
        f"{REACHABLE:.0%}"
        if key in EAGER_SHARE
        else f"guess: no H200 measurement for {key}; eager assumed at {share:.0%} of the copy ceiling"
    )
    if pattern and key not in ("silu_mul",) and card_bytes > 0 and eager_bytes > card_bytes:
        k *= eager_bytes / card_bytes
        ratio = eager_bytes / card_bytes
        how += f", times {ratio:.2g} for the fused pattern's fewer bytes ({eager_bytes} -> {card_bytes})"
    return Estimate(min(MAX_SPEEDUP, max(1.0, k)), how)


def _matrix_estimate(
    vendor: str, per_call_us: float, flops: int, tflops: float | None, card_bytes: int, copy_gbps: float | None
) -> Estimate:
    """k of a matrix product (convolution, attention): its vendor's measured time over the longer of its FLOPs at the
    matrix ceiling and its bytes at REACHABLE of the copy ceiling (plus the launch floor); 1 without a CUDA
    measurement (the vendor runs large ones near that ceiling: no saving is assumed)."""
    if copy_gbps is None or tflops is None or flops <= 0 or per_call_us <= 0:
        return Estimate(1.0, f"prior: the vendor's call ({vendor}) runs near the matrix ceiling")
    compute_us = flops / (tflops * 1e6)
    copy_us = card_bytes / (REACHABLE * copy_gbps * 1e3) if copy_gbps > 0 else 0.0
    ideal_us = max(compute_us, copy_us) + LAUNCH_FLOOR_US
    bound = (
        f"{flops:.3g} FLOP at {tflops:g} TFLOP/s (the matrix ceiling)"
        if compute_us >= copy_us
        else f"{card_bytes} bytes at {REACHABLE:.0%} of the measured copy ceiling ({copy_gbps:.0f} GB/s; more than its "
        f"{flops:.3g} FLOP take at {tflops:g} TFLOP/s)"
    )
    return Estimate(
        min(MAX_SPEEDUP, max(1.0, per_call_us / ideal_us)),
        f"measured: the vendor's ({vendor}) {per_call_us:.3g} us per call against {ideal_us:.3g} us for {bound} plus "
        f"a {LAUNCH_FLOOR_US:g} us launch floor",
    )


def saving(share: float, speedup: float) -> float:
    """Amdahl: the share of the model's time saved by making a share `share` `speedup` times faster."""
    return share * (1.0 - 1.0 / speedup) if speedup > 0 else 0.0


STATUS_ORDER: dict[VariantStatus, int] = {"card": 0, "unsupported": 1, "no-kernel": 2}
"""At equal saving (none, mostly): carded variants first, then those without a card, then views and allocations."""


def ranked(variants: list[Variant]) -> list[Variant]:
    """The variants ranked 1..n: largest expected saving first, then by STATUS_ORDER, then largest share. So the rows a
    table shows (every carded variant, then the largest without a card) hold ranks 1..k with no gaps."""
    order = sorted(variants, key=lambda v: (-v.expected_saving, STATUS_ORDER[v.status], -v.share, v.id))
    return [v.model_copy(update={"rank": k + 1}) for k, v in enumerate(order)]
