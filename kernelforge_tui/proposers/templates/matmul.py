"""Dense matrix products C = A B through shared-memory tiles, products and sums in fp32.

Convention: inputs A [M, K] and B [K, N], output C [M, N], row-major, one dtype (fp32, bf16 or fp16). M, N and K
are read from the tensors' shapes, so a square card's single size serves as all three; the plan passes the
shapes' own formulas.

Each block computes a bm x bn tile of C, stepping through K bk at a time: it stages A's bm x bk tile (transposed,
so that a thread's column of it is a row in shared memory) and B's bk x bn tile in shared memory as fp32, then
every thread accumulates a tm x tn micro-tile of C in registers with fused multiply-adds.

Parameters: `bm`, `bn`, `bk` (the tiles: each must divide its size, so no kernel needs edge checks), `tm`, `tn`
(the micro-tile: (bm/tm) x (bn/tn) threads), `layout` (blocked: a thread's rows and columns are adjacent, its
stores vectorised; strided: they lie bm/tm and bn/tn apart, so a warp's shared reads fall in distinct banks and
its stores coalesce), `vec` (elements per global load of a tile row, at most 16 bytes: must divide bk and bn, so
every load is aligned), `pad` (floats added to each shared row, against bank conflicts), `minb`.
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    Lever,
    Levers,
    Params,
    Space,
    Template,
    dtype_of,
    launch_bounds,
    naming_problem,
    prelude,
    vec_widths,
)

MAX_STATIC_SHARED = 48 * 1024
"""Static shared memory a block may declare without opting in."""
MAX_ACCUMULATORS = 64
"""A micro-tile of 8 x 8 floats per thread: more spills at the register counts a full block allows."""
MAX_GRID_Y = 65535


def _dims(card: OperatorCard) -> tuple[int, int, int]:
    """(M, N, K) of the card."""
    m, k = card.inputs[0].dims(card.sizes)
    n = card.inputs[1].dims(card.sizes)[1]
    return m, n, k


def _formulas(card: OperatorCard) -> tuple[str, str, str]:
    """(M, N, K) as the card's shape formulas, for the plan."""
    m, k = card.inputs[0].shape
    n = card.inputs[1].shape[1]
    return str(m), str(n), str(k)


def _each(var: str, count: str, body: str, indent: str) -> str:
    return f"{indent}#pragma unroll\n{indent}for (int {var} = 0; {var} < {count}; ++{var}) {{\n{body}{indent}}}\n"


class MatmulTemplate(Template):
    families = ("matmul",)
    entry = "kf_matmul"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("bm", "up", "bigger tiles: each element of B read fewer times"),
            Lever("bn", "up", "bigger tiles: each element of A read fewer times"),
            Lever("vec", "up", "wider tile loads"),
        ),
        "memory_latency": (
            Lever("minb", "up", "more resident blocks"),
            Lever("bk", "up", "more of K staged per barrier"),
            Lever("bm", "down", "more blocks"),
            Lever("bn", "down", "more blocks"),
        ),
        "compute": (
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
        shapes = [len(t.shape) for t in [*card.inputs, *card.outputs]]
        if shapes != [2, 2, 2]:
            return f"expects matrices A [M, K], B [K, N] -> C [M, N], card has ranks {shapes}"
        (m, k), (k2, n), c = (t.dims(card.sizes) for t in [*card.inputs, *card.outputs])
        if k != k2 or c != (m, n):
            return f"shapes {(m, k)} x {(k2, n)} -> {c} are not a matrix product"
        return None

    def space(self, card: OperatorCard) -> Space:
        """Every vec (8 at most) divides every bk and bn, and every tm and tn fits every bm and bn: a tile's rows
        split into whole aligned chunks, and a block has whole micro-tiles."""
        return {
            "bm": (16, 32, 64, 128),
            "bn": (16, 32, 64, 128),
            "bk": (8, 16, 32),
            "tm": (1, 2, 4, 8),
            "tn": (1, 2, 4, 8),
            "layout": ("blocked", "strided"),
            "vec": vec_widths(dtype_of(card)),
            "pad": (0, 1),
            "minb": (1, 2),
        }

    def canonical(self, card: OperatorCard, params: Params) -> Params:
        """A 1 x 1 micro-tile is the same kernel in both layouts."""
        if params["tm"] == 1 and params["tn"] == 1:
            return {**params, "layout": "strided"}
        return dict(params)

    def problem(self, card: OperatorCard, params: Params) -> str | None:
        bm, bn, bk = int(params["bm"]), int(params["bn"]), int(params["bk"])
        tm, tn, pad = int(params["tm"]), int(params["tn"]), int(params["pad"])
        m, n, k = _dims(card)
        for tile, name, size, axis in ((bm, "bm", m, "M"), (bn, "bn", n, "N"), (bk, "bk", k, "K")):
            if size % tile:
                return f"{name} {tile} does not divide {axis} = {size}"
        threads = bm // tm * (bn // tn)
        if not 32 <= threads <= 1024:
            return f"{bm // tm} x {bn // tn} = {threads} threads per block, outside 32..1024"
        if tm * tn > MAX_ACCUMULATORS:
            return f"{tm * tn} accumulators per thread (at most {MAX_ACCUMULATORS})"
        if int(params["minb"]) * threads > 2048:
            return f"minb {params['minb']} x {threads} threads exceeds 2048 threads per SM"
        if (shared := bk * (bm + bn + 2 * pad) * 4) > MAX_STATIC_SHARED:
            return f"{shared} bytes of shared tiles exceed {MAX_STATIC_SHARED}"
        if m // bm > MAX_GRID_Y:
            return f"grid y {m // bm} exceeds {MAX_GRID_Y}"
        return None

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        bm, bn, bk = int(params["bm"]), int(params["bn"]), int(params["bk"])
        tm, tn, vec, pad = int(params["tm"]), int(params["tn"]), int(params["vec"]), int(params["pad"])
        layout = str(params["layout"])
        threads = bm // tm * (bn // tn)
        blocked = layout == "blocked"
        row, col = ("ty * TM + i", "tx * TN + j") if blocked else ("ty + i * (BM / TM)", "tx + j * (BN / TN)")
        if blocked and tn % vec == 0:
            chunk = " float f[VEC];\n" + _each("v", "VEC", "  f[v] = acc[i][j + v];\n", " ")
            chunk += " store_chunk(C, ((row0 + ty * TM + i) * N + col0 + tx * TN + j) / VEC, f);\n"
            store = _each("i", "TM", "#pragma unroll\nfor (int j = 0; j < TN; j += VEC) {\n" + chunk + "}\n", "")
        else:
            store = _each(
                "i", "TM", _each("j", "TN", f"  C[(row0 + {row}) * N + col0 + {col}] = from_f(acc[i][j]);\n", " "), ""
            )
        zero = _each("i", "TM", _each("j", "TN", "  acc[i][j] = 0.0f;\n", " "), "")
        fma = _each("i", "TM", _each("j", "TN", "   acc[i][j] = fmaf(a[i], b[j], acc[i][j]);\n", "  "), " ")
        stage_a = _each("v", "VEC", "   As[kk + v][m] = f[v];\n", "  ")
        stage_b = _each("v", "VEC", "   Bs[kk][n + v] = f[v];\n", "  ")
        load_a = _each("i", "TM", f"   a[i] = As[kk][{row}];\n", "  ")
        load_b = _each("j", "TN", f"   b[j] = Bs[kk][{col}];\n", "  ")
        source = f"""// C = A B ({dtype}, fp32 products and sums): a {bm}x{bn} tile of C per block, K in steps of {bk}
// through shared memory, a {tm}x{tn} {layout} micro-tile per thread, {vec}-element loads.
// Generated by the template proposer.
{prelude(dtype, vec)}#define BM {bm}
#define BN {bn}
#define BK {bk}
#define TM {tm}
#define TN {tn}
#define PAD {pad}
#define THREADS {threads}

extern "C" __global__ void {launch_bounds(threads, int(params["minb"]))} {self.entry}(
    const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K) {{
__shared__ float As[BK][BM + PAD];  // A's tile transposed: As[k][m]
__shared__ float Bs[BK][BN + PAD];
const int tx = threadIdx.x % (BN / TN);
const int ty = threadIdx.x / (BN / TN);
const long long row0 = (long long)blockIdx.y * BM;
const long long col0 = (long long)blockIdx.x * BN;
float acc[TM][TN];
{zero}for (int k0 = 0; k0 < K; k0 += BK) {{
 for (int c = threadIdx.x; c < BM * (BK / VEC); c += THREADS) {{
  const int m = c / (BK / VEC);
  const int kk = c % (BK / VEC) * VEC;
  float f[VEC];
  load_chunk(A, ((row0 + m) * K + k0 + kk) / VEC, f);
{stage_a} }}
 for (int c = threadIdx.x; c < BK * (BN / VEC); c += THREADS) {{
  const int kk = c / (BN / VEC);
  const int n = c % (BN / VEC) * VEC;
  float f[VEC];
  load_chunk(B, ((long long)(k0 + kk) * N + col0 + n) / VEC, f);
{stage_b} }}
 __syncthreads();
#pragma unroll
 for (int kk = 0; kk < BK; ++kk) {{
  float a[TM];
  float b[TN];
{load_a}{load_b}{fma} }}
 __syncthreads();  // the tiles are read before the next step overwrites them
}}
{store}}}
"""
        m, n, k = _formulas(card)
        plan = LaunchPlan(
            entry=self.entry,
            grid=[f"cdiv({n}, {bn})", f"cdiv({m}, {bm})"],
            block=[threads],
            args=["A", "B", "C", m, n, k],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        vec = max(vec_widths(dtype_of(card)))
        base: Params = {
            "bm": 64, "bn": 64, "bk": 16, "tm": 4, "tn": 4, "layout": "strided", "vec": vec, "pad": 1, "minb": 1,
        }  # fmt: skip
        return [
            base,
            {**base, "bm": 128, "bn": 128, "bk": 8, "tm": 8, "tn": 8, "layout": "blocked", "pad": 0},
            {**base, "bm": 128, "tm": 8, "minb": 2},
            {**base, "bm": 32, "bn": 32, "bk": 32, "tm": 2, "tn": 2, "layout": "blocked"},
            {**base, "bm": 16, "bn": 16, "tm": 1, "tn": 1, "vec": 1, "pad": 0},  # the textbook shared-tile kernel
        ]
