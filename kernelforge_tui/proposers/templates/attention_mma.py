"""Attention forward on tensor cores, flash-style: y = softmax(scale q k^T [causal]) v, bf16 or fp16, fp32 sums.

Convention (the cards `kernelforge capture` makes of scaled_dot_product_attention, capture/families.py): inputs q
[batch, heads, sq, d], k [batch, heads, sk, d], v [batch, heads, sk, dv], output y [batch, heads, sq, dv], each
with its dims in the order they lie in memory (a [batch, seq, heads, dim] projection viewed as [batch, heads, seq,
dim] is a card tensor of dims [batch, sq, heads, d]); is_causal and scale come from the card's recorded call (the
CPU flash attention its reference replays: args[4], kwargs.scale). The head dim must be the innermost in memory:
the kernel reads rows of d contiguous elements wherever they lie, at strides the render computes from the card.

The kernel (cuda/attention_mma.cu) is FlashAttention-2's forward on mma.sync m16n8k16: a block of `warps` warps
takes 16 query rows a warp of one (batch, head) and walks the keys `bkv` at a time through two cp.async stages of
shared memory, the online softmax on the score accumulators, P fed back from registers. Causal cards stop at the
block's last query and run their longest blocks first.

Refused here, never run: fp32 (the suite's `attention` template runs on CUDA cores), a head dim other than 64 or 128
(the swizzle spans 8 chunks of 16 bytes) or d != dv, and a head dim that is not innermost in memory.
"""

from __future__ import annotations

import math
from typing import ClassVar

from kernelforge_tui.capture.families import ATTENTION_REPLAY
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    prelude_values,
)
from kernelforge_tui.proposers.templates.source import render

MMA_TYPES = {"bfloat16": "bf16", "float16": "f16"}
HEAD_DIMS = (64, 128)
DIMS = {
    "q": ("batch", "heads", "sq", "d"),
    "k": ("batch", "heads", "sk", "d"),
    "v": ("batch", "heads", "sk", "dv"),
    "y": ("batch", "heads", "sq", "dv"),
}
"""Each tensor's dims as the call saw them; a card tensor holds them in memory order."""
ELEMENT_BYTES = 2


class AttentionMmaParams(TemplateParams):
    warps: int
    bkv: int


class Attention(TemplateParams):
    """What the card says of its call: is_causal, the scale, and each tensor's strides (elements) for batch, head
    and row (read from the card, never searched)."""

    causal: bool
    scale: float
    strides: dict[str, tuple[int, int, int]]


def attention_of(card: OperatorCard) -> Attention | str:
    """The card's call and layouts, or why this template cannot serve the card (in words for `unsupported`)."""
    names = [t.name for t in card.inputs], [t.name for t in card.outputs]
    if names != (["q", "k", "v"], ["y"]):
        return f"expects inputs q, k, v and output y, card has {names[0]} -> {names[1]}"
    strides: dict[str, tuple[int, int, int]] = {}
    for tensor in (*card.inputs, *card.outputs):
        dims = [str(d) for d in tensor.shape]
        batch, head, row, inner = DIMS[tensor.name]
        if sorted(dims) != sorted(DIMS[tensor.name]):
            return f"{tensor.name} has dims {dims}: expects a memory order of {list(DIMS[tensor.name])}"
        if dims[-1] != inner:
            return f"{tensor.name} lies as {dims}: the kernel reads rows of {inner} contiguous elements"
        step = {name: math.prod(card.sizes[d] for d in dims[k + 1 :]) for k, name in enumerate(dims)}
        strides[tensor.name] = (step[batch], step[head], step[row])
    call = card.call
    if call is None or call.op != ATTENTION_REPLAY:
        return f"the card records no {ATTENTION_REPLAY} call ([call]) to read is_causal and scale from"
    passed = {a.path: a.value for a in call.args}
    causal, scale = passed.get("args[4]", False), passed.get("kwargs.scale")
    if not isinstance(causal, bool) or not isinstance(scale, (int, float)) or isinstance(scale, bool):
        return f"is_causal {causal!r} and scale {scale!r} in the recorded call: expects a bool and a number"
    return Attention(causal=causal, scale=float(scale), strides=strides)


def shared_bytes(card: OperatorCard, params: AttentionMmaParams) -> int:
    """q's tile and two stages of k's and v's."""
    return (16 * params.warps + 4 * params.bkv) * card.sizes["d"] * ELEMENT_BYTES


class AttentionMmaTemplate(Template[AttentionMmaParams]):
    name = "attention_mma"
    families = ("attention",)
    entry = "kf_attention"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (Lever("warps", "up", "each k and v tile serves more query rows"),),
        "memory_latency": (Lever("warps", "down", "more blocks in flight"), Lever("bkv", "down", "smaller stages")),
        "compute": (Lever("bkv", "up", "fewer rescales and barriers a key"),),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        found = attention_of(card)
        if isinstance(found, str):
            return found
        dtypes = {t.dtype for t in [*card.inputs, *card.outputs]}
        if len(dtypes) != 1 or not dtypes <= set(MMA_TYPES):
            return f"tensor cores take one of {sorted(MMA_TYPES)} here, card has {sorted(dtypes)}"
        d, dv = card.sizes["d"], card.sizes["dv"]
        if d != dv or d not in HEAD_DIMS:
            return f"head dims d {d} and dv {dv}: this kernel takes d = dv, one of {list(HEAD_DIMS)}"
        return None

    def space(self, card: OperatorCard) -> Space:
        return {"warps": (2, 4, 8), "bkv": (32, 64, 128)}

    def params_type(self, card: OperatorCard) -> type[AttentionMmaParams]:
        return AttentionMmaParams

    def problem(self, card: OperatorCard, params: AttentionMmaParams) -> str | None:
        """None: every combination of the space fits a Hopper SM at head dim 128 (at most 160 KiB of shared memory;
        the tests build them all, none spills)."""
        return None

    def render(self, card: OperatorCard, params: AttentionMmaParams) -> tuple[str, LaunchPlan]:
        found = attention_of(card)
        assert not isinstance(found, str), found
        dtype, sizes = dtype_of(card), card.sizes
        strides = {
            f"{name}_{part}": value
            for name, triple in found.strides.items()
            for part, value in zip(("sb", "sh", "ss"), triple, strict=True)
        }
        bq = 16 * params.warps
        source = render(
            "attention_mma.cu",
            **prelude_values(dtype, 8),
            **strides,
            dtype=dtype,
            mma_type=MMA_TYPES[dtype],
            scale=f"{found.scale:.6g}",
            causal_words=" (causal: key j <= query i)" if found.causal else "",
            causal=int(found.causal),
            scale_log2=f"{found.scale * math.log2(math.e)!r}f",
            d=sizes["d"],
            bq=bq,
            bkv=params.bkv,
            warps=params.warps,
            threads=32 * params.warps,
            batch=sizes["batch"],
            heads=sizes["heads"],
            sq=sizes["sq"],
            sk=sizes["sk"],
        )
        grid = sizes["batch"] * sizes["heads"] * -(-sizes["sq"] // bq)
        plan = LaunchPlan(
            entry=self.entry,
            grid=[grid],
            block=[32 * params.warps],
            shared_bytes=shared_bytes(card, params),
            args=["q", "k", "v", "y"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """FlashAttention-2's usual forward tiles: 4 warps (64 queries) over 64 keys, then 8 warps (128 queries) for
        long sequences, 128 keys a tile for a head dim of 64, and 32 for few keys."""
        return [
            {"warps": 4, "bkv": 64},
            {"warps": 8, "bkv": 64},
            {"warps": 4, "bkv": 128},
            {"warps": 4, "bkv": 32},
        ]
