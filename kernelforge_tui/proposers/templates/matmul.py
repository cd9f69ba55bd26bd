"""Dense matrix products C = A B: fp32 FMAs on CUDA cores, or bf16/fp16 mma.sync on tensor cores; sums in fp32.

Convention: inputs A [M, K] and B [K, N], output C [M, N], row-major, one dtype (fp32, bf16 or fp16). M, N and K
are read from the tensors' shapes, so a square card's single size serves as all three; the plan passes the
shapes' own formulas.

`strategy` fma: each block computes a bm x bn tile of C, stepping through K bk at a time: it stages A's bm x bk
tile (transposed, so that a thread's column of it is a row in shared memory) and B's bk x bn tile in shared memory
as fp32, then every thread accumulates a tm x tn micro-tile of C in registers with fused multiply-adds. `bm`, `bn`,
`bk` must divide their sizes (no edge checks), `tm`, `tn` (the micro-tile: (bm/tm) x (bn/tn) threads), `layout`
(blocked: a thread's rows and columns are adjacent, its stores vectorised; strided: they lie bm/tm and bn/tn apart,
so a warp's shared reads fall in distinct banks and its stores coalesce), `vec` (elements per global load of a tile
row, at most 16 bytes: must divide bk and bn, so every load is aligned), `pad` (floats added to each shared row).

`strategy` tc (bf16 and fp16; fp32 cards keep fma: TF32 inputs fail the sums' tolerance): a bm x bn x bk block tile
over (bm/wm) x (bn/wn) warps, each warp a wm x wn tile of m16n8k16 `mma.sync` products with fp32 accumulators, fed
by `ldmatrix` (B transposed on the way) from a `stages`-deep ring of shared tiles that `cp.async` fills 16 bytes a
copy while the tensor cores work on the oldest; `swizzle` xor stores chunk c of row r at c ^ f(r) so each 8-row
ldmatrix phase hits 8 distinct bank groups, `pad` adds 16 bytes a row instead. Edges: copies past M, N or K fill
zeros (zeros add nothing to a sum, and never meet an inf of a real element), stores past M or N are skipped, so
any M works and N, K need only be multiples of 8 (whole 16-byte chunks). The epilogue rounds C's tile to the dtype
in shared memory and writes it 16 bytes a store. Shared memory is dynamic (the worker opts in above 48 KiB).
`minb` bounds the registers for resident blocks per SM in both strategies.

The kernels are cuda/matmul_fma.cu and cuda/matmul_tc.cu.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kernelforge_tui.cards.expr import evaluate
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    ELEMENT_BYTES,
    MAX_DYNAMIC_SHARED,
    STATIC_SHARED,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    naming_problem,
    prelude_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import Value, render

MAX_ACCUMULATORS = 64
"""A micro-tile of 8 x 8 floats per thread: more spills at the register counts a full block allows."""
MAX_GRID_Y = 65535
TENSOR_CORE_TYPES = {"bfloat16": ("bf16", "__nv_bfloat162", "__floats2bfloat162_rn"),
                     "float16": ("f16", "__half2", "__floats2half2_rn")}  # fmt: skip
"""The mma operand type, the pair type and its rounding constructor of each dtype tensor cores take here."""
CHUNK = 8
"""Elements of one 16-byte cp.async copy, ldmatrix row and epilogue store (bf16 and fp16)."""
REGISTERS_PER_SM = 65536
MAX_REGISTERS = 255
ADDRESS_REGISTERS = 40
"""Registers a tc thread needs beside its accumulators and fragments (indices, addresses, loop counters): enough
that every variant the budget admits built without spills (tests/proposers/templates/test_matmul_tensor_core.py)."""


class MatmulParams(TemplateParams):
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    layout: Literal["blocked", "strided"]
    vec: int
    pad: int
    wm: int
    wn: int
    stages: int
    swizzle: Literal["xor", "pad"]
    minb: int
    strategy: Literal["fma", "tc"]


@dataclass(frozen=True)
class TensorCoreTiling:
    """The tc kernel's shape: every constant the source gets, and what the tests model, from one place."""

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int
    swizzle: bool

    @classmethod
    def of(cls, params: MatmulParams) -> TensorCoreTiling:
        p = params
        return cls(p.bm, p.bn, p.bk, p.wm, p.wn, p.stages, swizzle=p.swizzle == "xor")

    @property
    def warps_m(self) -> int:
        return self.bm // self.wm

    @property
    def warps_n(self) -> int:
        return self.bn // self.wn

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def mi(self) -> int:
        """m16 tiles per warp."""
        return self.wm // 16

    @property
    def ni(self) -> int:
        """n8 tiles per warp (an even count: one ldmatrix.x4.trans loads two)."""
        return self.wn // 8

    @property
    def a_stride(self) -> int:
        """Elements of a shared row of A's tile (bk, plus a chunk when padded)."""
        return self.bk + (0 if self.swizzle else CHUNK)

    @property
    def b_stride(self) -> int:
        return self.bn + (0 if self.swizzle else CHUNK)

    @property
    def c_stride(self) -> int:
        """The epilogue's rows are always padded: a warp's pair stores then span 8 bank groups."""
        return self.bn + CHUNK

    def xor_bits(self, chunks: int) -> tuple[int, int]:
        """(shift, mask) of the swizzle of a row of `chunks` 16-byte chunks: chunk c of row r lies at
        c ^ ((r >> shift) & mask). Rows of 8 chunks or more spread 8 consecutive rows over the low 3 bits; a row of
        4 (2) chunks shares 128 bytes with the next 1 (3) rows, so rows 2 (4) apart take the next mask value."""
        if not self.swizzle:
            return 0, 0
        if chunks >= 8:
            return 0, 7
        return (8 // chunks).bit_length() - 1, chunks - 1

    def shared_bytes(self, element_bytes: int) -> int:
        """The ring of A and B tiles, or C's tile in the epilogue, which reuses it."""
        ring = self.stages * (self.bm * self.a_stride + self.bk * self.b_stride)
        return max(ring, self.bm * self.c_stride) * element_bytes

    def registers(self) -> int:
        """Registers a thread needs: accumulators, one k16 step's A and B fragments, addresses."""
        return self.wm * self.wn // 32 + self.mi * 4 + self.ni * 2 + ADDRESS_REGISTERS

    def register_budget(self, minb: int) -> int:
        """Registers a thread may use so that minb blocks stay resident (allocated in steps of 8)."""
        return min(MAX_REGISTERS, REGISTERS_PER_SM // (minb * self.threads) // 8 * 8)


def _contraction(card: OperatorCard) -> bool:
    """Whether the card is the contraction C[a, b, c] = sum over d, e of A[a, d, e] B[d, b, e, c] (the suite's
    high_order_contraction): a product of A [a, (d e)] and B [(d e), (b c)] whose B rows interleave with its
    columns, so B is read through its own index; C [a, (b c)] and A are plain row-major matrices."""
    if [len(t.shape) for t in [*card.inputs, *card.outputs]] != [3, 4, 3]:
        return False
    (a, d, e), (d2, b, e2, c), out = ([str(x) for x in t.shape] for t in [*card.inputs, *card.outputs])
    return (d, e, out) == (d2, e2, [a, b, c])


def _formulas(card: OperatorCard) -> tuple[str, str, str]:
    """(M, N, K) as the card's shape formulas, for the plan."""
    if _contraction(card):
        a, d, e = card.inputs[0].shape
        b, c = card.inputs[1].shape[1], card.inputs[1].shape[3]
        return str(a), f"({b}) * ({c})", f"({d}) * ({e})"
    m, k = card.inputs[0].shape
    n = card.inputs[1].shape[1]
    return str(m), str(n), str(k)


def _dims(card: OperatorCard) -> tuple[int, int, int]:
    """(M, N, K) of the card."""
    m, n, k = (evaluate(formula, card.sizes) for formula in _formulas(card))
    return m, n, k


class MatmulTemplate(Template[MatmulParams]):
    name = "matmul"
    families = ("matmul",)
    entry = "kf_matmul"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("bm", "up", "bigger tiles: each element of B read fewer times"),
            Lever("bn", "up", "bigger tiles: each element of A read fewer times"),
            Lever("vec", "up", "wider tile loads"),
        ),
        "memory_latency": (
            Lever("stages", "up", "more tiles in flight"),
            Lever("minb", "up", "more resident blocks"),
            Lever("bk", "up", "more of K staged per barrier"),
            Lever("bm", "down", "more blocks"),
            Lever("bn", "down", "more blocks"),
        ),
        "compute": (
            Lever("strategy", "up", "tensor cores"),
            Lever("bm", "up", "more mma per tile loaded"),
            Lever("bn", "up", "more mma per tile loaded"),
            Lever("wm", "up", "more mma per ldmatrix"),
            Lever("wn", "up", "more mma per ldmatrix"),
            Lever("stages", "any", "shared memory against resident blocks"),
            Lever("swizzle", "any", "ldmatrix across banks"),
            Lever("tm", "up", "more FMAs per shared load"),
            Lever("tn", "up", "more FMAs per shared load"),
            Lever("pad", "up", "no shared-memory bank conflicts"),
            Lever("layout", "any", "shared reads across banks"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        problem = naming_problem(card, ["A", "B"], ["C"], [])
        if problem is not None:
            return problem
        if _contraction(card):
            return None
        shapes = [len(t.shape) for t in [*card.inputs, *card.outputs]]
        if shapes != [2, 2, 2]:
            return (
                f"expects matrices A [M, K], B [K, N] -> C [M, N] (or the contraction A [a, d, e], B [d, b, e, c] -> "
                f"C [a, b, c]), card has ranks {shapes}"
            )
        (m, k), (k2, n), c = (t.dims(card.sizes) for t in [*card.inputs, *card.outputs])
        if k != k2 or c != (m, n):
            return f"shapes {(m, k)} x {(k2, n)} -> {c} are not a matrix product"
        return None

    def space(self, card: OperatorCard) -> Space:
        """Every vec (8 at most) divides every bk and bn, and every tm and tn fits every bm and bn: a tile's rows
        split into whole aligned chunks, and a block has whole micro-tiles. The tc parameters have one value where
        tensor cores do not serve the dtype; strategy comes last, so a seed that does not fit
        a card is moved to its nearest valid params within its own strategy first. A contraction's B is no [K, N]
        matrix the tc kernel could copy: it takes fma only."""
        tensor_cores = dtype_of(card) in TENSOR_CORE_TYPES and not _contraction(card)  # tc reads B as [K, N]
        return {
            "bm": (16, 32, 64, 128, 256),
            "bn": (16, 32, 64, 128, 256),
            "bk": (8, 16, 32, 64),
            "tm": (1, 2, 4, 8),
            "tn": (1, 2, 4, 8),
            "layout": ("blocked", "strided"),
            "vec": vec_widths(dtype_of(card)),
            "pad": (0, 1),
            "wm": (16, 32, 64) if tensor_cores else (16,),
            "wn": (16, 32, 64) if tensor_cores else (16,),
            "stages": (2, 3, 4) if tensor_cores else (2,),
            "swizzle": ("xor", "pad") if tensor_cores else ("xor",),
            "minb": (1, 2),
            "strategy": ("fma", "tc") if tensor_cores else ("fma",),
        }

    def params_type(self, card: OperatorCard) -> type[MatmulParams]:
        return MatmulParams

    def canonical(self, card: OperatorCard, params: MatmulParams) -> MatmulParams:
        """Each strategy fixes the other's parameters; a 1 x 1 micro-tile is the same kernel in both layouts."""
        space = self.space(card)
        if params.strategy == "tc":
            return params.but(tm=1, tn=1, layout="strided", vec=space["vec"][-1], pad=0)
        fixed = params.but(**{key: space[key][0] for key in ("wm", "wn", "stages", "swizzle")})
        return fixed.but(layout="strided") if params.tm == 1 and params.tn == 1 else fixed

    def problem(self, card: OperatorCard, params: MatmulParams) -> str | None:
        if params.strategy == "tc":
            return self._tensor_core_problem(card, params)
        if _contraction(card) and (nc := evaluate(card.inputs[1].shape[3], card.sizes)) % params.vec:
            return f"vec {params.vec} does not divide c = {nc}: a chunk of B would span two of its rows"
        bm, bn, bk = params.bm, params.bn, params.bk
        tm, tn, pad = params.tm, params.tn, params.pad
        m, n, k = _dims(card)
        for tile, name, size, axis in ((bm, "bm", m, "M"), (bn, "bn", n, "N"), (bk, "bk", k, "K")):
            if size % tile:
                return f"{name} {tile} does not divide {axis} = {size}"
        threads = bm // tm * (bn // tn)
        if not 32 <= threads <= 1024:
            return f"{bm // tm} x {bn // tn} = {threads} threads per block, outside 32..1024"
        if tm * tn > MAX_ACCUMULATORS:
            return f"{tm * tn} accumulators per thread (at most {MAX_ACCUMULATORS})"
        if params.minb * threads > 2048:
            return f"minb {params.minb} x {threads} threads exceeds 2048 threads per SM"
        if (shared := bk * (bm + bn + 2 * pad) * 4) > STATIC_SHARED:
            return f"{shared} bytes of shared tiles exceed {STATIC_SHARED}"
        if m // bm > MAX_GRID_Y:
            return f"grid y {m // bm} exceeds {MAX_GRID_Y}"
        return None

    def _tensor_core_problem(self, card: OperatorCard, params: MatmulParams) -> str | None:
        dtype = dtype_of(card)
        if dtype not in TENSOR_CORE_TYPES:
            return f"tensor cores take bf16 or fp16 here, not {dtype}"
        m, n, k = _dims(card)
        if n % CHUNK or k % CHUNK:
            return f"tc copies {CHUNK}-element chunks: N = {n} and K = {k} must be multiples of {CHUNK}"
        tiling = TensorCoreTiling.of(params)
        if tiling.bk % 16:
            return f"bk {tiling.bk} is not a multiple of mma's k16"
        if tiling.bm % tiling.wm or tiling.bn % tiling.wn:
            return f"warp tile {tiling.wm} x {tiling.wn} does not divide block tile {tiling.bm} x {tiling.bn}"
        if tiling.threads > 512:
            return f"{tiling.threads // 32} warps per block (at most 16)"
        minb = params.minb
        if minb * tiling.threads > 2048:
            return f"minb {minb} x {tiling.threads} threads exceeds 2048 threads per SM"
        if (shared := tiling.shared_bytes(ELEMENT_BYTES[dtype])) * minb > MAX_DYNAMIC_SHARED:
            return f"minb {minb} x {shared} bytes of shared memory exceed {MAX_DYNAMIC_SHARED}"
        if tiling.registers() > (budget := tiling.register_budget(minb)):
            return f"about {tiling.registers()} registers a thread, {budget} allowed for {minb} blocks per SM"
        if -(-m // tiling.bm) > MAX_GRID_Y:
            return f"grid y {-(-m // tiling.bm)} exceeds {MAX_GRID_Y}"
        return None

    def render(self, card: OperatorCard, params: MatmulParams) -> tuple[str, LaunchPlan]:
        if params.strategy == "tc":
            return self._render_tensor_cores(card, params)
        return self._render_fma(card, params)

    def _render_fma(self, card: OperatorCard, params: MatmulParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        bm, bn, bk = params.bm, params.bn, params.bk
        tm, tn, vec, pad = params.tm, params.tn, params.vec, params.pad
        layout = params.layout
        threads = bm // tm * (bn // tn)
        blocked = layout == "blocked"
        row, col = ("ty * TM + i", "tx * TN + j") if blocked else ("ty + i * (BM / TM)", "tx + j * (BN / TN)")
        source = render(
            "matmul_fma.cu",
            **prelude_values(dtype, vec),
            dtype=dtype,
            bm=bm,
            bn=bn,
            bk=bk,
            tm=tm,
            tn=tn,
            pad=pad,
            layout=layout,
            threads=threads,
            minb=params.minb,
            row=row,
            col=col,
            vector_store=blocked and tn % vec == 0,
            **self._contraction_values(card),
        )
        m, n, k = _formulas(card)
        plan = LaunchPlan(
            entry=self.entry,
            grid=[f"cdiv({n}, {bn})", f"cdiv({m}, {bm})"],
            block=[threads],
            args=["A", "B", "C", m, n, k],
        )
        return source, plan

    def _contraction_values(self, card: OperatorCard) -> dict[str, Value]:
        """What cuda/matmul_fma.cu needs to read a contraction's B: e and c (its index's inner sizes)."""
        if not _contraction(card):
            return {"contraction": False}
        e, c = (evaluate(card.inputs[1].shape[axis], card.sizes) for axis in (2, 3))
        return {"contraction": True, "e": e, "nc": c}

    def _render_tensor_cores(self, card: OperatorCard, params: MatmulParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        mma_type, pair, round_pair = TENSOR_CORE_TYPES[dtype]
        t = TensorCoreTiling.of(params)
        a_shift, a_mask = t.xor_bits(t.bk // CHUNK)
        b_shift, b_mask = t.xor_bits(t.bn // CHUNK)
        shared_bytes = t.shared_bytes(ELEMENT_BYTES[dtype])
        source = render(
            "matmul_tc.cu",
            **prelude_values(dtype, CHUNK),
            dtype=dtype,
            banks="XOR-swizzled" if t.swizzle else "padded",
            bm=t.bm,
            bn=t.bn,
            bk=t.bk,
            wm=t.wm,
            wn=t.wn,
            warps_m=t.warps_m,
            warps_n=t.warps_n,
            mi=t.mi,
            ni=t.ni,
            stages=t.stages,
            threads=t.threads,
            a_stride=t.a_stride,
            b_stride=t.b_stride,
            c_stride=t.c_stride,
            a_shift=a_shift,
            a_mask=a_mask,
            b_shift=b_shift,
            b_mask=b_mask,
            minb=params.minb,
            mma_type=mma_type,
            pair=pair,
            round_pair=round_pair,
        )
        m, n, k = _formulas(card)
        plan = LaunchPlan(
            entry=self.entry,
            grid=[f"cdiv({n}, {t.bn})", f"cdiv({m}, {t.bm})"],
            block=[t.threads],
            shared_bytes=shared_bytes,
            args=["A", "B", "C", m, n, k],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """Tensor cores first (the fastest expected at 4096^3 leading), then the CUDA-core kernels, the textbook
        shared-tile kernel last (it fits every suite size)."""
        space = self.space(card)
        vec = max(vec_widths(dtype_of(card)))
        fma: Params = {
            "strategy": "fma", "bm": 64, "bn": 64, "bk": 16, "tm": 4, "tn": 4, "layout": "strided", "vec": vec,
            "pad": 1, **{key: space[key][0] for key in ("wm", "wn", "stages", "swizzle")}, "minb": 1,
        }  # fmt: skip
        tc: Params = {
            **fma, "strategy": "tc", "bm": 128, "bn": 128, "bk": 32, "tm": 1, "tn": 1, "pad": 0,
            "wm": 64, "wn": 32, "stages": 4, "swizzle": "xor", "minb": 2,
        }  # fmt: skip
        tensor_cores = [
            tc,
            {**tc, "bn": 256, "wn": 64, "stages": 3, "minb": 1},
            {**tc, "wn": 64, "stages": 3},
            {**tc, "bm": 64, "wm": 32, "stages": 3},
            {**tc, "bm": 32, "bn": 32, "wm": 16, "wn": 16, "stages": 2, "minb": 1},  # small cards: more blocks
        ]
        return [
            *(tensor_cores if "tc" in space["strategy"] else []),
            fma,
            {**fma, "bm": 128, "bn": 128, "bk": 8, "tm": 8, "tn": 8, "layout": "blocked", "pad": 0},
            {**fma, "bm": 128, "tm": 8, "minb": 2},
            {**fma, "bm": 32, "bn": 32, "bk": 32, "tm": 2, "tn": 2, "layout": "blocked"},
            {**fma, "bm": 16, "bn": 16, "tm": 1, "tn": 1, "vec": 1, "pad": 0},  # the textbook shared-tile kernel
        ]
