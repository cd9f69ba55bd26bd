"""Copies: matrix transposes through shared-memory tiles, flat copies and reversals with vector accesses.

The operation is a word of the card's name: `transpose` ([rows, cols] -> [cols, rows]), `reverse` ([n] -> [n],
y[i] = x[n - 1 - i]) or `copy` (one shape in and out). One input and one output of one dtype; values move as
their raw bits (bit-exact: NaN payloads and the sign of zero too), never through fp32.

Transpose parameters: `tile` (a tile x tile square per block, staged in shared memory so that the input is read
along its rows and the output written along its rows, both coalesced), `rpt` (rows each thread moves: the block
is tile x tile/rpt threads), `pad` (elements added to each shared row, so that reading a column of the tile hits
distinct banks: 1 for 4-byte elements, 2 for 2-byte ones). Edge tiles are bounds-checked: any rows and cols.

Copy and reverse parameters, as the elementwise template's: `vec` (elements per access, at most 16 bytes; must
divide n, so every chunk, and for reverse every mirrored chunk, is aligned), `block`, `unroll` (chunks per thread
per step, loads issued before stores), `loop` (grid_stride over `waves` x 132 SMs of blocks, or one_per_thread),
`minb`.

The kernels are cuda/transpose.cu and cuda/copy.cu.
"""

from __future__ import annotations

import re
from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    ELEMENT_BYTES,
    SM_COUNT,
    STREAMING_LEVERS,
    Lever,
    Levers,
    Params,
    Space,
    StreamingParams,
    Template,
    TemplateParams,
    dtype_of,
    prelude_values,
    streaming_canonical,
    streaming_loop,
    streaming_problem,
    streaming_space,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import render

OPERATIONS = ("transpose", "reverse", "copy")
BITS = {2: "unsigned short", 4: "unsigned int"}
"""The raw storage type of a shared tile element by byte size."""
MAX_GRID_Y = 65535


def operation(card: OperatorCard) -> str | None:
    """The first OPERATIONS name that is a word of the card's name (words split at anything but letters and
    digits: `matrix_transpose_bf16_s22`)."""
    words = set(re.split(r"[^A-Za-z0-9]+", card.name))
    return next((op for op in OPERATIONS if op in words), None)


def _count(card: OperatorCard) -> str:
    return " * ".join(f"({dim})" for dim in card.outputs[0].shape)


class TransposeParams(TemplateParams):
    tile: int
    rpt: int
    pad: int


class CopyTemplate(Template[TransposeParams | StreamingParams]):
    name = "copy"
    families = ("copy",)
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            *STREAMING_LEVERS["memory_bandwidth"],
            Lever("tile", "up", "longer coalesced runs"),
        ),
        "memory_latency": (
            *STREAMING_LEVERS["memory_latency"],
            Lever("rpt", "up", "more rows in flight per thread"),
            Lever("tile", "any", "tile size"),
        ),
        "compute": (
            *STREAMING_LEVERS["compute"],
            Lever("pad", "any", "shared-memory bank conflicts"),
        ),
    }
    """A flat copy's are the streaming ones; a transpose's the tile's (each space has only its own)."""

    def unsupported(self, card: OperatorCard) -> str | None:
        op = operation(card)
        if op is None:
            return f"no copy operation named in {card.name!r} (known: {', '.join(OPERATIONS)})"
        if len(card.inputs) != 1 or len(card.outputs) != 1:
            return f"{op} takes one input and one output"
        source, target = card.inputs[0], card.outputs[0]
        if source.dtype != target.dtype or source.dtype not in C_TYPE:
            return f"expects one dtype among {sorted(C_TYPE)}"
        have, want = source.dims(card.sizes), target.dims(card.sizes)
        if op == "transpose" and (len(have) != 2 or want != have[::-1]):
            return f"a transpose maps [rows, cols] to [cols, rows], card maps {list(have)} to {list(want)}"
        if op == "reverse" and len(have) != 1:
            return f"reverse takes a vector, card has shape {list(have)}"
        if have != want and op != "transpose":
            return f"{op} keeps the shape, card maps {list(have)} to {list(want)}"
        return None

    def space(self, card: OperatorCard) -> Space:
        if operation(card) == "transpose":
            return {"tile": (16, 32, 64), "rpt": (1, 2, 4, 8), "pad": (0, 1, 2)}
        return streaming_space(card)

    def params_type(self, card: OperatorCard) -> type[TransposeParams | StreamingParams]:
        return TransposeParams if operation(card) == "transpose" else StreamingParams

    def canonical(
        self, card: OperatorCard, params: TransposeParams | StreamingParams
    ) -> TransposeParams | StreamingParams:
        """A flat copy's as every streaming kernel's (waves only matter for grid_stride)."""
        return streaming_canonical(params) if isinstance(params, StreamingParams) else params

    def problem(self, card: OperatorCard, params: TransposeParams | StreamingParams) -> str | None:
        if isinstance(params, TransposeParams):
            tile, rpt = params.tile, params.rpt
            threads = tile * tile // rpt
            if rpt > tile or not 32 <= threads <= 1024:
                return f"a {tile} x {tile // rpt} block ({threads} threads) is outside 32..1024"
            rows = card.inputs[0].dims(card.sizes)[0]
            if -(-rows // tile) > MAX_GRID_Y:
                return f"grid y {-(-rows // tile)} exceeds {MAX_GRID_Y}"
            return None
        n, vec = card.outputs[0].numel(card.sizes), params.vec
        if n % vec:
            return f"vec {vec} does not divide n = {n} (chunks would be misaligned)"
        return streaming_problem(params)

    def render(self, card: OperatorCard, params: TransposeParams | StreamingParams) -> tuple[str, LaunchPlan]:
        if isinstance(params, TransposeParams):
            return self._transpose(card, params)
        return self._flat(card, params)

    def _transpose(self, card: OperatorCard, params: TransposeParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        tile, rpt, pad = params.tile, params.rpt, params.pad
        source = render(
            "transpose.cu",
            **prelude_values(dtype, 1),
            dtype=dtype,
            tile=tile,
            rpt=rpt,
            pad=pad,
            bits=BITS[ELEMENT_BYTES[dtype]],
            threads=tile * tile // rpt,
        )
        rows, cols = (str(dim) for dim in card.inputs[0].shape)
        plan = LaunchPlan(
            entry="kf_transpose",
            grid=[f"cdiv({cols}, {tile})", f"cdiv({rows}, {tile})"],
            block=[tile, tile // rpt],
            args=[card.inputs[0].name, card.outputs[0].name, rows, cols],
        )
        return source, plan

    def _flat(self, card: OperatorCard, params: StreamingParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        vec, block, unroll = params.vec, params.block, params.unroll
        reverse = operation(card) == "reverse"
        grid_stride = params.loop == "grid_stride"
        source = render(
            "copy.cu",
            **prelude_values(dtype, vec),
            what="Reverse" if reverse else "Copy",
            dtype=dtype,
            unroll=unroll,
            loop=streaming_loop(params),
            block=block,
            minb=params.minb,
            reverse=reverse,
            grid_stride=grid_stride,
        )
        count = _count(card)
        chunks = f"cdiv({count}, {block * vec * unroll})"
        grid = f"min({chunks}, {SM_COUNT * params.waves * params.minb})" if grid_stride else chunks
        plan = LaunchPlan(
            entry="kf_copy",
            grid=[grid],
            block=[block],
            args=[card.inputs[0].name, card.outputs[0].name, f"{count}:i64"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        if operation(card) == "transpose":
            pad = 4 // ELEMENT_BYTES[dtype_of(card)]  # one 4-byte bank per row
            return [
                {"tile": 32, "rpt": 4, "pad": pad},
                {"tile": 32, "rpt": 1, "pad": pad},
                {"tile": 64, "rpt": 8, "pad": pad},
                {"tile": 16, "rpt": 1, "pad": 1},
                {"tile": 32, "rpt": 4, "pad": 0},  # unpadded: a column read hits one bank
            ]
        vec = max(vec_widths(dtype_of(card)))
        base: Params = {"vec": vec, "block": 256, "unroll": 1, "loop": "grid_stride", "waves": 4, "minb": 1}
        return [
            base,
            {**base, "unroll": 4, "block": 512, "waves": 2, "minb": 2},
            {**base, "loop": "one_per_thread", "waves": 1},
            {**base, "loop": "one_per_thread", "waves": 1, "unroll": 2, "block": 128},
            {**base, "vec": 1, "block": 1024, "waves": 2},
        ]
