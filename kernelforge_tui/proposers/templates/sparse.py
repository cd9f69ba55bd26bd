"""Sparse products with fp32 accumulation: CSR SpMV (the warp-cooperative "vector" kernel), ELL SpMV, CSR SpMM.

Conventions (the suite's sparse cards, kernelforge_tui/suite/tasks/sparse.py): index arrays int32, values and the
dense operands of one float dtype;
- spmv_csr: values[nnz], col_idx[nnz], row_ptr[nrows + 1], x[ncols] -> y[nrows];
- spmv_ell: values[nrows, width], col_idx[nrows, width] (row-major; padding is column -1 and only trails a row's
  entries), x[ncols] -> y[nrows];
- spmm_csr: values[nnz], col_idx[nnz], row_ptr[nrows + 1], b[ncols, k] -> c[nrows, k].

Parameters: `tpr`, the lanes that share a row (1: a thread per row; 32: a warp per row), which stride the row's
entries and add their partial sums with xor shuffles; `rpb`, rows per block (the block is tpr * rpb threads, whole
warps, so a row's lanes never straddle a warp); `unroll`, how many of a lane's entries the compiler overlaps
(their loads in flight together). ELL adds `pad`: `skip` tests every slot, `stop` ends a lane at its first padding
slot (right because padding only trails, and a lane's slots ascend). SpMM replaces `tpr` with `vec` (columns of b
and c per lane, one vector load: k / vec lanes cover a row of c) and `split` (lane groups that share out a row's
entries, then add up by shuffles). Accumulation is always fp32: a 16-bit sum of a long row fails the tolerance.
"""

from __future__ import annotations

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    Params,
    Space,
    Template,
    dtype_of,
    launch_bounds,
    prelude,
    vec_widths,
)

KINDS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "spmv_csr": (["values", "col_idx", "row_ptr", "x"], ["y"], ["nrows"]),
    "spmv_ell": (["values", "col_idx", "x"], ["y"], ["nrows", "width"]),
    "spmm_csr": (["values", "col_idx", "row_ptr", "b"], ["c"], ["nrows", "k"]),
}
"""Inputs, outputs and sizes of each kernel the template writes."""
INDEX = ("col_idx", "row_ptr")
POWERS = (1, 2, 4, 8, 16, 32)
ROWS_PER_BLOCK = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
UNROLLS = (1, 2, 4, 8)


def kind_of(card: OperatorCard) -> str | None:
    """Which of the template's kernels the card's tensor names call for, if any."""
    names = ([t.name for t in card.inputs], [t.name for t in card.outputs])
    return next((kind for kind, (ins, outs, _) in KINDS.items() if names == (ins, outs)), None)


def _kind(card: OperatorCard) -> str:
    kind = kind_of(card)
    assert kind is not None, f"{card.name} is not a card the sparse template serves"
    return kind


def _lanes(params: Params, card: OperatorCard) -> int:
    """Lanes that share one row."""
    if _kind(card) == "spmm_csr":
        return card.sizes["k"] // int(params["vec"]) * int(params["split"])
    return int(params["tpr"])


class SparseTemplate(Template):
    families = ("sparse",)

    def unsupported(self, card: OperatorCard) -> str | None:
        kind = kind_of(card)
        if kind is None:
            have = ([t.name for t in card.inputs], [t.name for t in card.outputs])
            wanted = "; ".join(f"{k}: {ins} -> {outs}" for k, (ins, outs, _) in KINDS.items())
            return f"expects {wanted}; card has {have[0]} -> {have[1]} (CSC and COO have no template)"
        missing = [s for s in KINDS[kind][2] if s not in card.sizes]
        if missing:
            return f"card lacks sizes {missing}"
        floats = {t.dtype for t in [*card.inputs, *card.outputs] if t.name not in INDEX}
        if len(floats) != 1 or not floats <= set(C_TYPE):
            return f"expects values, dense operand and output of one dtype among {sorted(C_TYPE)}, card has {floats}"
        wrong = [t.name for t in card.inputs if t.name in INDEX and t.dtype != "int32"]
        if wrong:
            return f"expects int32 index arrays, card has {wrong} otherwise"
        return None

    def space(self, card: OperatorCard) -> Space:
        kind = _kind(card)
        if kind == "spmm_csr":
            return {
                "vec": vec_widths(dtype_of(card)),
                "split": (1, 2, 4, 8),
                "rpb": ROWS_PER_BLOCK,
                "unroll": UNROLLS[:3],
            }
        space: Space = {"tpr": POWERS, "rpb": ROWS_PER_BLOCK, "unroll": UNROLLS}
        if kind == "spmv_ell":
            space["pad"] = ("skip", "stop")
        return space

    def canonical(self, card: OperatorCard, params: Params) -> Params:
        """ELL: a lane has width / tpr slots, so unrolling past them changes nothing."""
        if _kind(card) != "spmv_ell":
            return dict(params)
        slots = card.sizes["width"] // int(params["tpr"])
        return {**params, "unroll": max(u for u in UNROLLS if u <= max(1, min(slots, int(params["unroll"]))))}

    def problem(self, card: OperatorCard, params: Params) -> str | None:
        kind = _kind(card)
        if kind == "spmm_csr":
            k, vec = card.sizes["k"], int(params["vec"])
            if k % vec:
                return f"vec {vec} does not divide k = {k}: a row of b would end inside a vector"
            columns = k // vec
            if columns & (columns - 1) or columns * int(params["split"]) > 32:
                return f"k / vec * split = {columns * int(params['split'])} lanes a row: not a power of two <= 32"
        elif kind == "spmv_ell" and int(params["tpr"]) > card.sizes["width"]:
            return f"tpr {params['tpr']} > width {card.sizes['width']}: lanes with no slot"
        threads = _lanes(params, card) * int(params["rpb"])
        if not 32 <= threads <= 1024:
            return f"{threads} threads a block (lanes a row x rpb) outside 32..1024"
        return None

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        kind = _kind(card)
        dtype = dtype_of(card)
        lanes, rpb = _lanes(params, card), int(params["rpb"])
        block = lanes * rpb
        head = (
            prelude(dtype, int(params.get("vec", 1)))
            + f"""#define FULL_MASK 0xffffffffu
#define LANES {lanes}  // lanes a row: whole warps a block, groups aligned within a warp
#define RPB {rpb}
"""
        )
        bounds = launch_bounds(block, 1)
        if kind == "spmm_csr":
            body, args = _spmm_csr(card, params, bounds), ["values", "col_idx", "row_ptr", "b", "c", "nrows"]
        elif kind == "spmv_ell":
            body, args = _spmv_ell(card, params, bounds), ["values", "col_idx", "x", "y", "nrows"]
        else:
            body, args = _spmv_csr(params, bounds), ["values", "col_idx", "row_ptr", "x", "y", "nrows"]
        comment = f"// Sparse {kind} (fp32 accumulation): {', '.join(f'{k} {v}' for k, v in params.items())}.\n"
        comment += "// Generated by the template proposer.\n"
        source = comment + head + body
        plan = LaunchPlan(entry=f"kf_{kind}", grid=[f"cdiv(nrows, {rpb})"], block=[block], args=args)
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        kind = _kind(card)
        if kind == "spmm_csr":
            widest = max(vec_widths(dtype_of(card)))
            return [
                {"vec": 1, "split": 1, "rpb": 8, "unroll": 1},
                {"vec": 4, "split": 2, "rpb": 16, "unroll": 2},
                {"vec": widest, "split": 4, "rpb": 32, "unroll": 2},
            ]
        if kind == "spmv_ell":
            return [
                {"tpr": 1, "rpb": 256, "unroll": 8, "pad": "stop"},
                {"tpr": 4, "rpb": 64, "unroll": 2, "pad": "skip"},
                {"tpr": 8, "rpb": 32, "unroll": 4, "pad": "stop"},
                {"tpr": 32, "rpb": 8, "unroll": 1, "pad": "stop"},
            ]
        return [
            {"tpr": 1, "rpb": 256, "unroll": 1},
            {"tpr": 4, "rpb": 64, "unroll": 2},
            {"tpr": 8, "rpb": 32, "unroll": 2},
            {"tpr": 32, "rpb": 8, "unroll": 4},
        ]


ROW = """const int lane = threadIdx.x % LANES;
const int r = blockIdx.x * RPB + threadIdx.x / LANES;
"""

REDUCE = """// Every lane of the warp gets here (no early return), so full-mask shuffles are safe.
#pragma unroll
for (int o = LANES / 2; o > 0; o >>= 1) {
    sum += __shfl_xor_sync(FULL_MASK, sum, o);
}
if (lane == 0 && r < nrows) {
    y[r] = from_f(sum);
}
}
"""


def _spmv_csr(params: Params, bounds: str) -> str:
    return (
        f"""
extern "C" __global__ void {bounds} kf_spmv_csr(const T* __restrict__ values, const int* __restrict__ col_idx,
    const int* __restrict__ row_ptr, const T* __restrict__ x, T* __restrict__ y, int nrows) {{
{ROW}float sum = 0.0f;
if (r < nrows) {{
    const int end = row_ptr[r + 1];
#pragma unroll {params["unroll"]}
    for (int p = row_ptr[r] + lane; p < end; p += LANES) {{
        sum += to_f(values[p]) * to_f(x[col_idx[p]]);
    }}
}}
"""
        + REDUCE
    )


def _spmv_ell(card: OperatorCard, params: Params, bounds: str) -> str:
    add = "sum += to_f(values[base + s]) * to_f(x[col]);"
    if params["pad"] == "stop":  # padding only trails a row and a lane's slots ascend: its later slots are padding
        use = f"if (col < 0) {{\n            break;\n        }}\n        {add}"
    else:
        use = f"if (col >= 0) {{\n            {add}\n        }}"
    return (
        f"""#define WIDTH {card.sizes["width"]}

extern "C" __global__ void {bounds} kf_spmv_ell(const T* __restrict__ values, const int* __restrict__ col_idx,
    const T* __restrict__ x, T* __restrict__ y, int nrows) {{
{ROW}float sum = 0.0f;
if (r < nrows) {{
    const long long base = (long long)r * WIDTH;
#pragma unroll {params["unroll"]}
    for (int s = lane; s < WIDTH; s += LANES) {{
        const int col = col_idx[base + s];
        {use}
    }}
}}
"""
        + REDUCE
    )


def _spmm_csr(card: OperatorCard, params: Params, bounds: str) -> str:
    columns = card.sizes["k"] // int(params["vec"])
    return f"""#define COLUMN_LANES {columns}  // lanes across a row of c, VEC columns each
#define SPLIT {params["split"]}  // groups of COLUMN_LANES lanes that share out a row's entries

extern "C" __global__ void {bounds} kf_spmm_csr(const T* __restrict__ values, const int* __restrict__ col_idx,
    const int* __restrict__ row_ptr, const T* __restrict__ b, T* __restrict__ c, int nrows) {{
{ROW}const int part = lane / COLUMN_LANES;
const int chunk = lane % COLUMN_LANES;
float acc[VEC];
#pragma unroll
for (int j = 0; j < VEC; ++j) {{
    acc[j] = 0.0f;
}}
if (r < nrows) {{
    const int end = row_ptr[r + 1];
#pragma unroll {params["unroll"]}
    for (int p = row_ptr[r] + part; p < end; p += SPLIT) {{
        const float v = to_f(values[p]);
        float f[VEC];
        load_chunk(b, (long long)col_idx[p] * COLUMN_LANES + chunk, f);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {{
            acc[j] += v * f[j];
        }}
    }}
}}
// Every lane of the warp gets here; xor over the part bits adds the SPLIT groups' partial rows.
#pragma unroll
for (int o = LANES / 2; o >= COLUMN_LANES; o >>= 1) {{
#pragma unroll
    for (int j = 0; j < VEC; ++j) {{
        acc[j] += __shfl_xor_sync(FULL_MASK, acc[j], o);
    }}
}}
if (part == 0 && r < nrows) {{
    store_chunk(c, (long long)r * COLUMN_LANES + chunk, acc);
}}
}}
"""
