"""Row reductions: softmax, rms_norm and layer_norm over the last axis, math in fp32.

Conventions (the example cards'): softmax x -> y; rms_norm x, w -> y with eps 1e-6; layer_norm
x, w, b -> y with eps 1e-5; x and y are [rows, cols], w and b are [cols]; one dtype (fp32/bf16/fp16).

Parameters: `strategy` (warp_per_row, rows_per_block, block_per_row) with `block` and `rpb` (rows per
block) fixing TPR, the threads that share a row; `vec` (elements per vector access; must divide cols,
so every chunk of every row is aligned and there is no tail); `storage` of the row between passes
(registers: read once, needs cols <= TPR * ITEMS * VEC; smem: read once into dynamic shared memory;
stream: read again from global/L2); `minb` (the __launch_bounds__ min blocks per SM); softmax adds
`online` (max and sum in one pass and one reduction) and `fast_exp`; layer_norm adds `welford` (one
reduction of (count, mean, M2) instead of mean then centred sum of squares). `fast_exp` (__expf) is valid only
where the card's tolerance admits it (`fast_math_allowed`).

The kernel is cuda/row_reductions.cu: one pass over a thread's chunks a storage, the op's passes and reductions
chosen by the family and the parameters; this module only chooses the values it renders with.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    ELEMENT_BYTES,
    MAX_DYNAMIC_SHARED,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    fast_math_allowed,
    naming_problem,
    prelude_values,
    reduce_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import render

TENSORS = {"softmax": (["x"], ["y"]), "rms_norm": (["x", "w"], ["y"]), "layer_norm": (["x", "w", "b"], ["y"])}
EPS = {"rms_norm": "1e-6f", "layer_norm": "1e-5f"}
MAX_FLOATS_PER_THREAD = 64
"""Row values a thread may hold in registers (also capped at a quarter of 64K registers / block)."""


class RowParams(TemplateParams):
    strategy: Literal["warp_per_row", "rows_per_block", "block_per_row"]
    block: int
    rpb: int
    vec: int
    storage: Literal["registers", "smem", "stream"]
    minb: int
    online: int | None = None
    """softmax: 1, the online max and sum in one pass."""
    fast_exp: int | None = None
    """softmax: 1, __expf where the card's tolerance admits it."""
    welford: int | None = None
    """layer_norm: 1, Welford's statistics in one pass."""


class RowTemplate(Template[RowParams]):
    """One kernel shape for all three: TPR threads per row, RPB rows per block, grid cdiv(rows, RPB)."""

    name = "rows"
    version = 2
    families = ("softmax", "rms_norm", "layer_norm")
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("storage", "down", "the row read once"),
            Lever("vec", "up", "wider accesses"),
            Lever("online", "up", "one pass fewer"),
            Lever("welford", "up", "one pass fewer"),
        ),
        "memory_latency": (
            Lever("minb", "up", "more resident blocks"),
            Lever("block", "any", "threads per row"),
            Lever("rpb", "any", "rows per block"),
            Lever("strategy", "any", "how threads share rows"),
        ),
        "compute": (
            Lever("fast_exp", "up", "fast exp"),
            Lever("vec", "up", "fewer instructions per element"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        inputs, outputs = TENSORS[card.family]
        return naming_problem(card, inputs, outputs, ["rows", "cols"])

    def space(self, card: OperatorCard) -> Space:
        space: Space = {
            "strategy": ("warp_per_row", "rows_per_block", "block_per_row"),
            "block": (64, 128, 256, 512, 1024),
            "rpb": (1, 2, 4, 8, 16, 32),
            "vec": vec_widths(dtype_of(card)),
            "storage": ("registers", "smem", "stream"),
            "minb": (1, 2, 4),
        }
        if card.family == "softmax":
            space |= {"online": (0, 1), "fast_exp": (0, 1)}
        if card.family == "layer_norm":
            space["welford"] = (0, 1)
        return space

    def params_type(self, card: OperatorCard) -> type[RowParams]:
        return RowParams

    def canonical(self, card: OperatorCard, params: RowParams) -> RowParams:
        """warp_per_row and block_per_row fix rpb; rows_per_block with 32 or all threads per row is one of them."""
        if params.strategy == "warp_per_row":
            return params.but(rpb=params.block // 32)
        if params.strategy == "block_per_row":
            return params.but(rpb=1)
        if params.rpb == 1:
            return params.but(strategy="block_per_row")
        if params.block == 32 * params.rpb:
            return params.but(strategy="warp_per_row")
        return params

    def problem(self, card: OperatorCard, params: RowParams) -> str | None:
        cols, block, rpb, vec = card.sizes["cols"], params.block, params.rpb, params.vec
        tpr = block // rpb
        nvec = cols // vec
        if block % rpb or tpr < 4:
            return f"block {block} / rpb {rpb} leaves fewer than 4 threads per row"
        if cols % vec:
            return f"vec {vec} does not divide cols {cols} (rows would start misaligned)"
        if tpr > max(32, nvec):
            return f"{tpr} threads per row for {nvec} chunks leaves threads idle"
        if params.minb * block > 2048:
            return f"minb {params.minb} x block {block} exceeds 2048 threads per SM"
        if params.fast_exp and not fast_math_allowed(card):
            return "fast_exp: the card's tolerance is tighter than __expf's error"
        if params.storage == "registers":
            items = -(-nvec // tpr)
            if items * vec > min(MAX_FLOATS_PER_THREAD, 16384 // block):
                return f"{items * vec} floats per thread do not fit in registers at block {block}"
        if params.storage == "smem" and rpb * cols * ELEMENT_BYTES[dtype_of(card)] > MAX_DYNAMIC_SHARED:
            return f"{rpb} rows of {cols} do not fit in shared memory"
        return None

    def render(self, card: OperatorCard, params: RowParams) -> tuple[str, LaunchPlan]:
        family = card.family
        dtype = dtype_of(card)
        block, rpb, vec = params.block, params.rpb, params.vec
        tpr = block // rpb
        storage = params.storage
        items = -(-(card.sizes["cols"] // vec) // tpr)
        inputs, outputs = TENSORS[family]
        entry = f"kf_{family}"
        signature = ", ".join(
            [*(f"const T* __restrict__ {name}" for name in inputs), "T* __restrict__ y", "int rows", "int cols"]
        )
        source = render(
            "row_reductions.cu",
            **prelude_values(dtype, vec),
            **reduce_values(params.fast_exp != 0),  # a family without the parameter uses no exp
            family=family,
            dtype=dtype,
            strategy=params.strategy,
            tpr=tpr,
            rpb=rpb,
            storage=storage,
            items=items,
            eps=EPS.get(family, ""),
            block=block,
            minb=params.minb,
            signature=signature,
            registers=storage == "registers",
            smem=storage == "smem",
            stream=storage == "stream",
            softmax=family == "softmax",
            rms_norm=family == "rms_norm",
            layer_norm=family == "layer_norm",
            online=bool(params.online),
            welford=bool(params.welford),
            max_scratch=family == "softmax" and not params.online,
            sum_scratch=not (params.online or params.welford),
        )
        shared_bytes = rpb * card.sizes["cols"] * ELEMENT_BYTES[dtype] if storage == "smem" else 0
        plan = LaunchPlan(
            entry=entry,
            grid=[f"cdiv(rows, {rpb})"],
            block=[block],
            shared_bytes=f"{rpb} * cols * {ELEMENT_BYTES[dtype]}" if shared_bytes else 0,
            args=[*inputs, *outputs, "rows", "cols"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        vec = max(vec_widths(dtype_of(card)))
        extra: Params = {}
        if card.family == "softmax":
            extra = {"online": 0, "fast_exp": int(dtype_of(card) != "float32" and fast_math_allowed(card))}
        if card.family == "layer_norm":
            extra = {"welford": 0}
        base: Params = {"rpb": 1, "vec": vec, "minb": 1, **extra}
        seeds: list[Params] = [
            {**base, "strategy": "block_per_row", "block": 1024, "storage": "registers"},
            {**base, "strategy": "block_per_row", "block": 512, "storage": "registers"},
            {**base, "strategy": "block_per_row", "block": 256, "storage": "smem"},
            {**base, "strategy": "warp_per_row", "block": 256, "storage": "registers"},
            {**base, "strategy": "rows_per_block", "block": 256, "rpb": 4, "storage": "registers"},
            {**base, "strategy": "block_per_row", "block": 512, "storage": "stream"},
            {**base, "strategy": "warp_per_row", "block": 128, "storage": "stream", "vec": 1},
        ]
        if card.family == "softmax":
            seeds.append({**base, "strategy": "block_per_row", "block": 1024, "storage": "stream", "online": 1})
        if card.family == "layer_norm":
            seeds.append({**base, "strategy": "block_per_row", "block": 512, "storage": "registers", "welford": 1})
        return seeds
