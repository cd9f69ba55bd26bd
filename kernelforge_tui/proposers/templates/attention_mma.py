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

The suite's softmax_attention cards (q, k, v, o [heads, seq, d], scale 1/sqrt(d), no mask) are served too, as one
batch. Refused here, never run: fp32 (the suite's `attention` template runs on CUDA cores), a head dim other than
64 or 128 (the swizzle spans 8 chunks of 16 bytes) or d != dv, a head dim that is not innermost in memory, and
triangle attention (its bias).
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
    call_scalars,
    dtype_of,
    dtypes_problem,
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


ROUNDED_P_MIN_ATOL = {"bfloat16": 2.0**-9, "float16": 2.0**-11}
"""P (weights in [0, 1]) rounded to the element type moves an output by up to about the type's half-ulp at 1 times
the values' scale: a card whose atol is below it takes P split into hi + lo (`split_p`)."""


class AttentionMmaParams(TemplateParams):
    warps: int
    bkv: int
    split_p: int


class Attention(TemplateParams):
    """What the card says of its attention (read from the card, never searched): is_causal, the scale, the sizes,
    each tensor's strides (elements) for batch, head and row, and the output's name."""

    causal: bool
    scale: float
    batch: int
    heads: int
    sq: int
    sk: int
    d: int
    dv: int
    strides: dict[str, tuple[int, int, int]]
    output: str


def attention_of(card: OperatorCard) -> Attention | str:
    """The card's attention, from the captured convention or the suite's (softmax_attention: q, k, v, o [heads, seq,
    d] over one batch, no mask, scale 1/sqrt(d)), or why this template cannot serve the card."""
    names = [t.name for t in card.inputs], [t.name for t in card.outputs]
    if names == (["q", "k", "v"], ["o"]):
        return _suite_attention(card)
    if names != (["q", "k", "v"], ["y"]):
        return f"expects inputs q, k, v and output y (or the suite's o), card has {names[0]} -> {names[1]}"
    strides: dict[str, tuple[int, int, int]] = {}
    for tensor in (*card.inputs, *card.outputs):
        dims = [str(d) for d in tensor.shape]
        batch, head, row, inner = DIMS[tensor.name]
        if sorted(dims) != sorted(DIMS[tensor.name]):
            return f"{tensor.name} has dims {dims}: expects a memory order of {list(DIMS[tensor.name])}"
        if dims[-1] != inner:
            return f"{tensor.name} lies as {dims}: the kernel reads rows of {inner} contiguous elements"
        step = dict(zip(dims, tensor.strides(card.sizes), strict=True))
        strides[tensor.name] = (step[batch], step[head], step[row])
    passed = call_scalars(card, ATTENTION_REPLAY, "is_causal and scale")
    if isinstance(passed, str):
        return passed
    causal, scale = passed.get("args[4]", False), passed.get("kwargs.scale")
    if not isinstance(causal, bool) or not isinstance(scale, (int, float)) or isinstance(scale, bool):
        return f"is_causal {causal!r} and scale {scale!r} in the recorded call: expects a bool and a number"
    sizes = {name: card.sizes[name] for name in ("batch", "heads", "sq", "sk", "d", "dv")}
    return Attention(causal=causal, scale=float(scale), strides=strides, output="y", **sizes)


def _suite_attention(card: OperatorCard) -> Attention | str:
    shapes = [[str(d) for d in t.shape] for t in (*card.inputs, *card.outputs)]
    if any(shape != ["heads", "seq", "d"] for shape in shapes):
        return (
            f"the suite's attention lies as [heads, seq, d] (triangle attention is not served here), card has {shapes}"
        )
    heads, seq, d = (card.sizes[name] for name in ("heads", "seq", "d"))
    step = (heads * seq * d, seq * d, d)
    strides = dict.fromkeys(("q", "k", "v", "y"), step)
    return Attention(
        causal=False, scale=d**-0.5, batch=1, heads=heads, sq=seq, sk=seq, d=d, dv=d, strides=strides, output="o"
    )


def shared_bytes(attention: Attention, params: AttentionMmaParams) -> int:
    """q's tile and two stages of k's and v's."""
    return (16 * params.warps + 4 * params.bkv) * attention.d * ELEMENT_BYTES


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
        dtype = dtypes_problem(card, MMA_TYPES, "tensor cores take")
        if dtype is not None:
            return dtype
        if found.d != found.dv or found.d not in HEAD_DIMS:
            return f"head dims d {found.d} and dv {found.dv}: this kernel takes d = dv, one of {list(HEAD_DIMS)}"
        return None

    def space(self, card: OperatorCard) -> Space:
        atol = min(out.effective_tolerance().atol for out in card.outputs)
        rounded = atol >= ROUNDED_P_MIN_ATOL.get(dtype_of(card), 1.0)
        return {"warps": (2, 4, 8), "bkv": (32, 64, 128), "split_p": (0, 1) if rounded else (1,)}

    def params_type(self, card: OperatorCard) -> type[AttentionMmaParams]:
        return AttentionMmaParams

    def problem(self, card: OperatorCard, params: AttentionMmaParams) -> str | None:
        """None: every combination of the space fits a Hopper SM at head dim 128 (at most 160 KiB of shared memory;
        the tests build the heaviest, 128 keys a tile with P split, at every block size: none spills)."""
        return None

    def render(self, card: OperatorCard, params: AttentionMmaParams) -> tuple[str, LaunchPlan]:
        found = attention_of(card)
        assert not isinstance(found, str), found
        dtype = dtype_of(card)
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
            split_p=params.split_p,
            p_form="as hi + lo" if params.split_p else "rounded",
            scale_log2=f"{found.scale * math.log2(math.e)!r}f",
            d=found.d,
            bq=bq,
            bkv=params.bkv,
            warps=params.warps,
            threads=32 * params.warps,
            batch=found.batch,
            heads=found.heads,
            sq=found.sq,
            sk=found.sk,
        )
        plan = LaunchPlan(
            entry=self.entry,
            grid=[found.batch * found.heads * -(-found.sq // bq)],
            block=[32 * params.warps],
            shared_bytes=shared_bytes(found, params),
            args=["q", "k", "v", found.output],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """FlashAttention-2's usual forward tiles: 4 warps (64 queries) over 64 keys, then 8 warps (128 queries) for
        long sequences, 128 keys a tile for a head dim of 64, and 32 for few keys; P rounded where the card's
        tolerance allows it (else split: the space holds only that)."""
        split = min(self.space(card)["split_p"])
        return [
            {"warps": 4, "bkv": 64, "split_p": split},
            {"warps": 8, "bkv": 64, "split_p": split},
            {"warps": 4, "bkv": 128, "split_p": split},
            {"warps": 4, "bkv": 32, "split_p": split},
        ]
