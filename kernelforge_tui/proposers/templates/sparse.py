"""Sparse products with fp32 accumulation: CSR SpMV (a lane group per row, a block's entries shared evenly by its
threads, a cluster's entries shared evenly by its blocks, or the launch's late long rows summed by its early
blocks), ELL SpMV, CSR SpMM.

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

CSR SpMV has five strategies (`strategy`), because a lane group per row is only as fast as its longest row: the
suite's timed matrices are power-law, whose entries spread evenly over row lengths from 1 to 65536 (as many in rows
of 16-32 entries as in rows of 32768-65536), and a warp alone on a row of 44000 entries takes hundreds of load
round trips while the GPU idles.
- `vector`: the lane group per row above, loading `vec` consecutive entries at once from the multiple of vec at or
  before the row's start (the neighbours' entries in a row's first and last chunk are read, never added);
- `stream`: the block owns rpb rows and streams their entries in tiles of block * items, coalesced, `vec` entries a
  load: products value * x[col] go to shared memory, then each thread sums `items` consecutive products row by row
  (a binary search of the block's row pointers finds its first row), so every thread does the same work whatever
  the rows' lengths; a row that ends inside a thread's share is added to its shared accumulator, the row still
  going at a share's end is first added up across the warp (a segmented shuffle sum), then added once. The next
  tile's loads are issued before the current tile is summed. Where a thread's share is exactly the one chunk it
  loads (items == vec: DIRECT), its products stay in its registers and the loop has no barrier (no thread reads
  another's products; a row's sums reach acc by one store or shared atomics), one after it. Every row is summed within
  one block (a card gives one launch, a poisoned y and no scratch memory, so blocks cannot combine partial rows), so
  a long row costs its block several tiles; the hardware's block scheduler balances the uneven blocks. Sums run in
  another order than a sequential loop's (shares, then shuffles and shared atomics): fp32's tolerance admits any
  order.
- `balanced`: the stream kernel's blocks are uneven (one owning a row of 65536 entries has ~8x the average
  block's work on the suite's power-law card, and started late it is the launch's tail), so a thread block cluster
  of `cluster` blocks (2, 4 or 8: portable sizes) owns cluster * rpb consecutive rows and splits their W entries
  evenly by count, not by rows: block k streams entries [E0 + W * k / cluster, E0 + W * (k + 1) / cluster) (E0
  the cluster's first entry; 64-bit products) exactly as a stream block streams its rows' (the same tiles and
  loop, one copy: TILES), so a long row's entries are shared by the cluster's blocks and no block is a tail. Each
  block's shared sums then hold its range's part of every row it touches; after cluster.sync() each row is written
  once, by the block whose range holds the row's first entry (rows starting at the cluster's end, its trailing
  empty rows, by the last block; an empty row as 0), adding the parts of the later blocks whose ranges start inside
  the row (their first row), read through distributed shared memory (map_shared_rank); a second cluster.sync()
  keeps every block's shared memory until the others have read it. Blocks with an empty range (a cluster of fewer
  entries than blocks) add zeros. Each block keeps the row pointers and sums of all the cluster's rows (a block's
  range may hold most of them when another's is one long row): cluster * rpb rows within the static shared memory.
  That fixed cost per block grows with the cluster while the block's entries shrink, and dynamic shared memory
  for more rows would cost occupancy (every block keeps a copy of its cluster's rows). Stream and cuSPARSE both run
  at the L2's limit: what stream lacks is the tail, blocks with a long row started last.
- `adopt`: stream without that tail. Blocks start in about index order, so a late block owning a row of 10,000 to
  44,000 entries finishes last; here the launch's later half hands its long rows (over `long` entries, the first
  HANDED of a block's, in order) to the earlier half: block b < blocks / 2 adopts those of block blocks - 1 - b,
  sums each first (a one-row job of the same tiled loop, its y written by the adopter), then its own rows; the late
  block streams the runs of its rows between the rows it handed over and writes the others. Both find the rows by
  the same test of the same row pointers (the adopter loads its late block's beside its own), so every row is
  summed and written by one block whatever order the blocks run in: the order only decides the speed. A thread tests
  one row of each block, so rpb <= block. Sharing each long row out over a thread block cluster instead (its blocks
  exchanging partial sums through distributed shared memory) is slower: its per-block protocol costs time even with
  a cluster of one, and co-scheduled clusters lower the achieved occupancy.
- `paired`: stream with the row blocks of each pair b, blocks - 1 - b swapped when the later one has more entries
  (thread 0 compares them), so the heavier of each pair starts in the launch's first half: whole blocks move, no
  lists, but a long row among light ones moves with them.
All take `hint` (`stream`: values and col_idx, read once, with evict-first loads, and x through the read-only
path, so x stays in L2; `plain`: ordinary loads) and `minb` (the __launch_bounds__ blocks per SM). Vector loads
need vec to divide nnz (a chunk from a multiple of vec then never passes the arrays' end; row_ptr[nrows] = nnz).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    ELEMENT_BYTES,
    STATIC_SHARED,
    THREADS_PER_SM,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    dtype_of,
    launch_bounds,
    prelude,
    vec_widths,
)

KINDS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "spmv_csr": (["values", "col_idx", "row_ptr", "x"], ["y"], ["nrows", "nnz"]),
    "spmv_ell": (["values", "col_idx", "x"], ["y"], ["nrows", "width"]),
    "spmm_csr": (["values", "col_idx", "row_ptr", "b"], ["c"], ["nrows", "k"]),
}
"""Inputs, outputs and sizes of each kernel the template writes."""
INDEX = ("col_idx", "row_ptr")
POWERS = (1, 2, 4, 8, 16, 32)
ROWS_PER_BLOCK = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
UNROLLS = (1, 2, 4, 8)
STRATEGIES = ("vector", "stream", "balanced", "adopt", "paired")
TILED = ("stream", "balanced", "adopt", "paired")
"""The strategies that stream entries in tiles (one kernel body, see TILES)."""
BLOCKS = (128, 256, 512, 1024)
ITEMS = (4, 8, 16, 32)
"""stream: entries a thread loads, and then sums, per tile."""
ENTRY_VECS = (1, 2, 4, 8)
"""CSR: consecutive entries a load reads (values: 4 to 32 bytes, col_idx 4 to 32; above 16, two 16-byte loads)."""
HINTS = ("plain", "stream")
MIN_BLOCKS = (1, 2, 4)
CLUSTERS = (2, 4, 8)
"""balanced: blocks a cluster (the portable sizes: a plain launch honours __cluster_dims__ up to 8)."""
LONG_ROWS = (256, 1024, 2048, 4096, 8192, 16384)
"""adopt: the row length past which a late block's row is long (handed over to its adopter)."""
HANDED = 16
"""adopt: a late block's long rows handed over at most (it sums any more itself)."""
UNUSED_BY_ADOPT: Params = {"tpr": POWERS[0], "unroll": UNROLLS[0], "cluster": CLUSTERS[0]}
UNUSED_BY_BALANCED: Params = {"tpr": POWERS[0], "unroll": UNROLLS[0], "long": LONG_ROWS[0]}
UNUSED_BY_STREAM: Params = {**UNUSED_BY_BALANCED, "cluster": CLUSTERS[0]}
UNUSED_BY_VECTOR: Params = {"block": BLOCKS[0], "items": ITEMS[0], "cluster": CLUSTERS[0], "long": LONG_ROWS[0]}
"""CSR SpMV's parameters the other strategies have, at the values each strategy's canonical params fix them to."""
UNUSED_BY: dict[str, Params] = {
    "vector": UNUSED_BY_VECTOR,
    "stream": UNUSED_BY_STREAM,
    "balanced": UNUSED_BY_BALANCED,
    "adopt": UNUSED_BY_ADOPT,
    "paired": UNUSED_BY_STREAM,
}


def kind_of(card: OperatorCard) -> str | None:
    """Which of the template's kernels the card's tensor names call for, if any."""
    names = ([t.name for t in card.inputs], [t.name for t in card.outputs])
    return next((kind for kind, (ins, outs, _) in KINDS.items() if names == (ins, outs)), None)


def _kind(card: OperatorCard) -> str:
    kind = kind_of(card)
    assert kind is not None, f"{card.name} is not a card the sparse template serves"
    return kind


def _streams(card: OperatorCard, params: Params) -> bool:
    """Whether the params pick one of CSR SpMV's tiled strategies (all but vector)."""
    return _kind(card) == "spmv_csr" and params["strategy"] in TILED


def _lanes(params: Params, card: OperatorCard) -> int:
    """Lanes that share one row (lane-group kernels)."""
    if _kind(card) == "spmm_csr":
        return card.sizes["k"] // int(params["vec"]) * int(params["split"])
    return int(params["tpr"])


def _threads(params: Params, card: OperatorCard) -> int:
    """Threads a block."""
    if _streams(card, params):
        return int(params["block"])
    return _lanes(params, card) * int(params["rpb"])


def stream_shared_bytes(params: Params) -> int:
    """The tiled kernels' shared memory: the row pointers and sums of the block's rows (balanced: of its cluster's
    cluster * rpb rows, any of which its range may hold), and a tile's products (a pad word every 32, see SKEW)
    unless each thread sums only the entries it loaded (DIRECT)."""
    rows = int(params["rpb"]) * (int(params["cluster"]) if params.get("strategy") == "balanced" else 1)
    direct = params["items"] == params.get("vec")  # DIRECT: each thread's products stay in its registers
    tile = 0 if direct else int(params["block"]) * int(params["items"])
    # adopt: the handed rows, the adopted rows with their first and last entries and sums, the warps' counts.
    lists = 5 * HANDED + int(params["block"]) // 32 if params.get("strategy") == "adopt" else 0
    return 4 * ((rows + 1) + rows + tile + max(0, tile - 1) // 32 + lists)


class SparseTemplate(Template):
    families = ("sparse",)
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("vec", "up", "wider loads of the entries"),
            Lever("hint", "up", "entries streamed past L2, x kept there"),
            Lever("pad", "up", "padding slots not read"),
        ),
        "memory_latency": (
            Lever("strategy", "up", "a block's entries shared evenly, not a row per lane group"),
            Lever("unroll", "up", "more loads in flight"),
            Lever("items", "up", "more entries in flight per thread"),
            Lever("cluster", "up", "a cluster's blocks share its rows' entries evenly"),
            Lever("long", "down", "more of the late blocks' rows summed early, by their adopters"),
            Lever("split", "up", "more lane groups share a row"),
            Lever("minb", "up", "more resident blocks"),
            Lever("tpr", "any", "threads per row"),
            Lever("rpb", "any", "rows per block"),
            Lever("block", "any", "block size"),
        ),
        "compute": (Lever("vec", "up", "fewer instructions per entry"),),
    }
    """CSR SpMV is bandwidth-bound when balanced (wider, streamed loads) and latency-bound when a lane group waits
    on a long row (share the entries, more in flight); each space has only its own."""

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
        if kind == "spmv_ell":
            return {"tpr": POWERS, "rpb": ROWS_PER_BLOCK, "unroll": UNROLLS, "pad": ("skip", "stop")}
        return {
            "strategy": STRATEGIES,
            "tpr": POWERS,
            "rpb": ROWS_PER_BLOCK,
            "unroll": UNROLLS,
            "block": BLOCKS,
            "items": ITEMS,
            "vec": ENTRY_VECS,
            "hint": HINTS,
            "minb": MIN_BLOCKS,
            "cluster": CLUSTERS,
            "long": LONG_ROWS,
        }

    def canonical(self, card: OperatorCard, params: Params) -> Params:
        """ELL: a lane has width / tpr slots, so unrolling past them changes nothing. CSR SpMV: the parameters a
        strategy does not use are fixed at their first values (balanced uses stream's and its cluster)."""
        kind = _kind(card)
        if kind == "spmv_csr":
            return {**params, **UNUSED_BY[str(params["strategy"])]}
        if kind != "spmv_ell":
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
        elif kind == "spmv_csr":
            vec, nnz = int(params["vec"]), card.sizes["nnz"]
            if nnz % vec:
                return f"vec {vec} does not divide nnz = {nnz}: the last chunk would read past the arrays"
            if _streams(card, params) and int(params["items"]) % vec:
                return f"items {params['items']} is not a whole number of vec {vec} chunks"
            if params["strategy"] == "adopt" and int(params["rpb"]) > int(params["block"]):
                return f"adopt: rpb {params['rpb']} > block {params['block']} (a thread tests one row of each block)"
            if _streams(card, params) and (shared := stream_shared_bytes(params)) > STATIC_SHARED:
                return f"{shared} bytes of shared memory a block: over the {STATIC_SHARED} it may declare"
            if int(params["minb"]) * _threads(params, card) > THREADS_PER_SM:
                return f"minb {params['minb']} x {_threads(params, card)} threads exceeds {THREADS_PER_SM} an SM"
        threads = _threads(params, card)
        if not 32 <= threads <= 1024:
            return f"{threads} threads a block (lanes a row x rpb) outside 32..1024"
        return None

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        kind = _kind(card)
        dtype = dtype_of(card)
        rpb, block = int(params["rpb"]), _threads(params, card)
        balanced = kind == "spmv_csr" and params["strategy"] == "balanced"
        head = prelude(dtype, int(params.get("vec", 1))) + f"#define FULL_MASK 0xffffffffu\n#define RPB {rpb}\n"
        if not _streams(card, params):
            lanes = _lanes(params, card)
            head += f"#define LANES {lanes}  // lanes a row: whole warps a block, groups aligned within a warp\n"
        bounds = launch_bounds(block, int(params.get("minb", 1)))
        if kind == "spmm_csr":
            body, args = _spmm_csr(card, params, bounds), ["values", "col_idx", "row_ptr", "b", "c", "nrows"]
        elif kind == "spmv_ell":
            body, args = _spmv_ell(card, params, bounds), ["values", "col_idx", "x", "y", "nrows"]
        else:
            kernel: dict[str, Callable[[Params, str], str]] = {
                "vector": _spmv_csr,
                "stream": _spmv_csr_stream,
                "balanced": _spmv_csr_balanced,
                "adopt": _spmv_csr_adopt,
                "paired": _spmv_csr_stream,
            }
            body = _loads(str(params["hint"])) + kernel[str(params["strategy"])](params, bounds)
            args = ["values", "col_idx", "row_ptr", "x", "y", "nrows"]
        # `cluster` and `long` named only where used: the older kernels' sources predate them (measurements are
        # keyed by source).
        used = {"cluster": balanced, "long": kind == "spmv_csr" and params["strategy"] == "adopt"}
        named = {k: v for k, v in params.items() if used.get(k, True)}
        comment = f"// Sparse {kind} (fp32 accumulation): {', '.join(f'{k} {v}' for k, v in named.items())}.\n"
        comment += "// Generated by the template proposer.\n"
        source = comment + head + body
        # balanced: a cluster of `cluster` blocks a cluster * rpb rows.
        grid = (
            f"cdiv(nrows, {rpb * int(params['cluster'])}) * {params['cluster']}" if balanced else f"cdiv(nrows, {rpb})"
        )
        plan = LaunchPlan(entry=f"kf_{kind}", grid=[grid], block=[block], args=args)
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
        return csr_seeds(card)


def _rows_for(card: OperatorCard, entries: int) -> int:
    """The rows per block whose entries, at the card's mean row length, make about `entries`."""
    mean = max(1, card.sizes["nnz"] // max(1, card.sizes["nrows"]))
    return max((r for r in ROWS_PER_BLOCK if r * mean <= entries), default=ROWS_PER_BLOCK[0])


def _cluster_rows_for(card: OperatorCard, params: Params, entries: int) -> int:
    """balanced: the rows per block whose cluster's entries, at the card's mean row length, make about `entries`,
    within the shared memory a block may declare (it holds the row pointers and sums of all the cluster's rows)."""
    mean = max(1, card.sizes["nnz"] // max(1, card.sizes["nrows"]))
    cluster = int(params["cluster"])
    fits = [r for r in ROWS_PER_BLOCK if stream_shared_bytes({**params, "rpb": r}) <= STATIC_SHARED] or [1]
    return max((r for r in fits if cluster * r * mean <= entries), default=fits[0])


def csr_seeds(card: OperatorCard) -> list[Params]:
    """CSR SpMV's seeds, the one expected fastest first: the adopt strategy (the fastest measured on the suite's
    power-law card: the docs' results page), blocks of 256 threads, each summing the one 16-byte chunk it loads
    (DIRECT); then blocks of 512, two an SM, so that DIRECT's registers fit), rows over 4096 entries handed over;
    then the stream strategy with 16-byte loads of the values (4 fp32 or 8 bf16 entries) in tiles of 4096
    entries, rows per block sized so the average block fills one tile, 16 entries a thread, then bigger tiles (a
    long row takes fewer); then the balanced strategy, clusters of 2 whose
    average entries fill two tiles of 4096 (the best balanced shape measured; the cluster's shared row pointers and
    its assembly cost more than the balance gains there); then lane groups sized to the mean row (tpr 4 x vec 4 and
    tpr 8 x vec 2 cover 16 entries a pass),
    a warp per row, and a thread per row (the baseline's shape)."""
    wide = 16 // ELEMENT_BYTES[dtype_of(card)]
    # Threads an SM at 8 entries a thread: bf16's 8-entry chunks make those kernels DIRECT, whose registers do not
    # fit 2048 threads (ptxas spills at 32 registers).
    full = THREADS_PER_SM // (2 if wide == 8 else 1)
    balanced: list[tuple[Params, int]] = [  # the params, and the cluster's entries at the mean row
        ({"block": 512, "items": 8, "minb": full // 512, "cluster": 2}, 16384),
    ]
    streams: list[Params] = [
        {"block": 256, "items": 16, "rpb": _rows_for(card, 4096), "minb": 4},
        {"block": 512, "items": 16, "rpb": _rows_for(card, 8192), "minb": 2},
        {"block": 1024, "items": 8, "rpb": _rows_for(card, 8192), "minb": full // 1024},
        {"block": 128, "items": 32, "rpb": _rows_for(card, 4096), "minb": 4},
    ]
    vectors: list[Params] = [
        {"tpr": 4, "rpb": 64, "unroll": 2, "vec": 4, "minb": 4},
        {"tpr": 8, "rpb": 32, "unroll": 2, "vec": 2, "minb": 4},
        {"tpr": 32, "rpb": 8, "unroll": 4, "vec": wide, "minb": 4},
        {"tpr": 1, "rpb": 256, "unroll": 1, "vec": 1, "minb": 1, "hint": "plain"},
    ]
    adopts: list[Params] = [  # rows per block at most one a thread (see COMPACT)
        {"block": 256, "items": max(4, wide), "rpb": min(256, _rows_for(card, 4096)), "minb": 4, "long": 4096},
        {"block": 512, "items": wide, "rpb": min(512, _rows_for(card, 8192)), "minb": 2, "long": 4096},
    ]
    tiled: Params = {"vec": wide, "hint": "stream"}
    return [
        *({"strategy": "adopt", **tiled, **UNUSED_BY_ADOPT, **p} for p in adopts),
        *({"strategy": "stream", **tiled, **UNUSED_BY_STREAM, **p} for p in streams),
        *(
            {"strategy": "balanced", **tiled, **UNUSED_BY_BALANCED, **p, "rpb": _cluster_rows_for(card, p, entries)}
            for p, entries in balanced
        ),
        *({"strategy": "vector", "hint": "stream", **UNUSED_BY_VECTOR, **p} for p in vectors),
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


def _loads(hint: str) -> str:
    """How CSR SpMV reads: ONCE for values and col_idx (read once), GATHER for x, and Pack, VEC entries a load."""
    once, gather, why = {
        "stream": ("__ldcs(p)", "__ldg(p)", "evict-first, so x stays in L2; x through the read-only path"),
        "plain": ("*(p)", "*(p)", "plain loads"),
    }[hint]
    return f"""
// Entries are read once: {why}.
#define ONCE(p) {once}
#define GATHER(p) {gather}

// Word<B>: what one load of B bytes reads (16 bytes and more: 16-byte words).
template <int B>
struct Word {{
    typedef int4 type;
}};
template <>
struct Word<8> {{
    typedef int2 type;
}};
template <>
struct Word<4> {{
    typedef int type;
}};
template <>
struct Word<2> {{
    typedef unsigned short type;
}};

// VEC consecutive entries of values or col_idx from a multiple of VEC (so aligned), read as whole words.
template <typename E>
union Pack {{
    typedef typename Word<sizeof(E) * VEC>::type W;
    E e[VEC];
    W w[sizeof(E) * VEC > 16 ? sizeof(E) * VEC / 16 : 1];

    __device__ Pack() {{}}
    __device__ __forceinline__ void load(const E* __restrict__ base, int q) {{
        const W* words = reinterpret_cast<const W*>(base + q);
#pragma unroll
        for (int k = 0; k < int(sizeof(w) / sizeof(W)); ++k) {{
            w[k] = ONCE(words + k);
        }}
    }}
}};
"""


def _spmv_csr(params: Params, bounds: str) -> str:
    return (
        f"""
extern "C" __global__ void {bounds} kf_spmv_csr(const T* __restrict__ values, const int* __restrict__ col_idx,
    const int* __restrict__ row_ptr, const T* __restrict__ x, T* __restrict__ y, int nrows) {{
{ROW}float sum = 0.0f;
if (r < nrows) {{
    const int start = row_ptr[r];
    const int end = row_ptr[r + 1];
    // Chunks from the multiple of VEC at or before the row's start: the neighbours' entries they hold are read,
    // never added.
#pragma unroll {params["unroll"]}
    for (int q = (start & ~(VEC - 1)) + lane * VEC; q < end; q += LANES * VEC) {{
        Pack<T> v;
        Pack<int> c;
        v.load(values, q);
        c.load(col_idx, q);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {{
            if (q + j >= start && q + j < end) {{
                sum += to_f(v.e[j]) * to_f(GATHER(x + c.e[j]));
            }}
        }}
    }}
}}
"""
        + REDUCE
    )


def _stream_helpers(params: Params) -> str:
    """The tiled kernels' sizes, the search for an entry's row and the tile's loads."""
    return f"""#define BLOCK {params["block"]}
#define ITEMS {params["items"]}  // entries a thread loads, then sums, per tile
#define CHUNKS (ITEMS / VEC)
#define DIRECT (ITEMS == VEC)  // a thread sums the very entries it loads: products in registers, no barrier a tile
#define TILE (BLOCK * ITEMS)  // entries a block streams a step
#define SKEW(i) ((i) + ((i) >> 5))  // a pad word every 32: a thread's ITEMS consecutive products in distinct banks

// The block's row holding entry p (rp[0] <= p < rp[n]): the last of its n rows starting at or before p, never an
// empty one.
__device__ __forceinline__ int row_of(const int* rp, int n, int p) {{
    int lo = 0;
    int hi = n - 1;
    while (lo < hi) {{
        const int mid = (lo + hi + 1) >> 1;
        if (rp[mid] <= p) {{
            lo = mid;
        }} else {{
            hi = mid - 1;
        }}
    }}
    return lo;
}}

// The tile from entry a (a multiple of VEC): chunk threadIdx.x + m * BLOCK (coalesced), those starting before last.
// Chunks never pass the arrays' end: last <= nnz, a multiple of VEC.
__device__ __forceinline__ void load_tile(const T* __restrict__ values, const int* __restrict__ col_idx, int a,
                                          int last, Pack<T> (&v)[CHUNKS], Pack<int> (&c)[CHUNKS]) {{
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {{
        const int q = a + (threadIdx.x + m * BLOCK) * VEC;
        if (q < last) {{
            v[m].load(values, q);
            c[m].load(col_idx, q);
        }}
    }}
}}
"""


SIGNATURE = """kf_spmv_csr(const T* __restrict__ values, const int* __restrict__ col_idx,
    const int* __restrict__ row_ptr, const T* __restrict__ x, T* __restrict__ y, int nrows) {
"""
"""The CSR SpMV kernel's name and parameters (after its attributes)."""

PRODUCTS = """#if !DIRECT
    __shared__ float prod[SKEW(TILE - 1) + 1];  // a tile's products value * x[col], summed by other threads
#endif
"""
"""The tiled kernels' products in shared memory, unless each thread sums only its own (DIRECT)."""

BLOCK_ROWS = (
    """    __shared__ int rp[RPB + 1];  // the block's row pointers
    __shared__ float acc[RPB];  // its rows' sums
"""
    + PRODUCTS
)
"""A block's rows in shared memory (stream's, paired's, adopt's): their pointers and sums, and a tile's products."""

ROWS_IN = """    for (int i = threadIdx.x; i <= n; i += BLOCK) {
        rp[i] = row_ptr[r0 + i];
    }
    for (int i = threadIdx.x; i < n; i += BLOCK) {
        acc[i] = 0.0f;  // an empty row's sum
    }
    __syncthreads();
"""
"""The tiled kernels' n rows from r0: their row pointers rp[0..n] and zeroed sums acc[0..n) in shared memory."""

TILES = """    const int lane = threadIdx.x & 31;
    Pack<T> v[CHUNKS];
    Pack<int> c[CHUNKS];
    int a = first & ~(VEC - 1);
    load_tile(values, col_idx, a, last, v, c);
    for (; a < last; a += TILE) {  // the same trip count in every thread: rp is shared
        // The products (chunk entries outside the block's rows are never summed), then the next tile's loads,
        // in flight while this one is summed.
#if DIRECT
        float mine[VEC];  // the one chunk this thread loaded is its share
#endif
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m) {
            const int k = threadIdx.x + m * BLOCK;
            if (a + k * VEC < last) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    const float product = to_f(v[m].e[j]) * to_f(GATHER(x + c[m].e[j]));
#if DIRECT
                    mine[j] = product;
#else
                    prod[SKEW(k * VEC + j)] = product;
#endif
                }
            }
        }
        load_tile(values, col_idx, a + TILE, last, v, c);
#if !DIRECT
        __syncthreads();
#endif
        // This thread's share: ITEMS consecutive entries, summed in order. A row ending inside is stored to acc if
        // it also began inside (no other share has any of it), else added.
        const int own = a + threadIdx.x * ITEMS;
        const int lo = max(own, first);
        const int hi = min(own + ITEMS, last);
        int row = 0;
        int end = 0;
        bool alone = false;  // `row` began inside this share
        if (lo < hi) {
            row = row_of(rp, n, lo);
            end = rp[row + 1];
            alone = rp[row] == lo;
        }
        float s = 0.0f;
        bool pending = false;  // s holds entries of `row` not yet in acc
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            const int p = own + j;
            if (p >= lo && p < hi) {
#if DIRECT
                s += mine[j];
#else
                s += prod[SKEW(p - a)];
#endif
                pending = true;
                if (p + 1 == end) {
                    if (alone) {
                        acc[row] = s;
                    } else {
                        atomicAdd(&acc[row], s);
                    }
                    s = 0.0f;
                    pending = false;
                    alone = true;
                    do {  // on to the row holding p + 1, past empty rows (which start and end there)
                        ++row;
                    } while (row < n && rp[row + 1] == end);
                    end = row < n ? rp[row + 1] : last;
                }
            }
        }
        // The row still going at the share's end: equal keys are neighbours (shares ascend), so a segmented sum
        // down the warp leaves each run's total in its first lane, which adds it once.
        const int key = pending ? row : -1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float below = __shfl_down_sync(FULL_MASK, s, o);
            const int below_key = __shfl_down_sync(FULL_MASK, key, o);
            if (lane + o < 32 && below_key == key) {
                s += below;
            }
        }
        const int above_key = __shfl_up_sync(FULL_MASK, key, 1);
        if (key >= 0 && (lane == 0 || above_key != key)) {
            atomicAdd(&acc[key], s);
        }
#if !DIRECT
        __syncthreads();  // acc complete for this tile, prod free for the next
#endif
    }
#if DIRECT
    __syncthreads();  // acc complete: no thread reads another's products or sums inside the loop
#endif
"""
"""The tiled kernels' loop: entries [first, last) (of rows rp[0..n]) streamed a tile at a time, the sums of their
rows' entries in that range added to acc."""


PAIRED = """    // Blocks b and blocks - 1 - b swap row blocks when the later one's has more entries: the earlier block
    // streams the heavier of the two, so the launch's heavy row blocks start in its first half.
    __shared__ int row_block;
    if (threadIdx.x == 0) {
        const int early = min((int)blockIdx.x, (int)gridDim.x - 1 - (int)blockIdx.x);
        const int late = (int)gridDim.x - 1 - early;
        const int early_entries = row_ptr[min((early + 1) * RPB, nrows)] - row_ptr[early * RPB];
        const int late_entries = row_ptr[min((late + 1) * RPB, nrows)] - row_ptr[late * RPB];
        row_block = late_entries > early_entries ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    }
    __syncthreads();
    const int r0 = row_block * RPB;
"""
"""paired: the row block a block streams."""


def _spmv_csr_stream(params: Params, bounds: str) -> str:
    """stream, and paired (stream with the row blocks of each pair b, blocks - 1 - b heavier first)."""
    row_block = PAIRED if params["strategy"] == "paired" else "    const int r0 = blockIdx.x * RPB;\n"
    return (
        _stream_helpers(params)
        + f"""
extern "C" __global__ void {bounds} {SIGNATURE}"""
        + BLOCK_ROWS
        + row_block
        + """    const int n = min(RPB, nrows - r0);
"""
        + ROWS_IN
        + """    const int first = rp[0];
    const int last = rp[n];
"""
        + TILES
        + """    for (int i = threadIdx.x; i < n; i += BLOCK) {
        y[r0 + i] = from_f(acc[i]);
    }
}
"""
    )


CLUSTER_HELPERS = """
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// The first of the row pointers rp[0..n] at or past entry p (n when only rp[n] is).
__device__ __forceinline__ int first_at(const int* rp, int n, int p) {
    int lo = 0;
    int hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (rp[mid] < p) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Where block k of a cluster starts in the cluster's w entries from e0 (block k streams [bound(k), bound(k + 1)),
// bound(CLUSTER) = e0 + w); 64-bit, as w * k may pass 2^31.
__device__ __forceinline__ int bound(int e0, int w, int k) {
    return e0 + (int)((long long)w * k / CLUSTER);
}
"""


def _spmv_csr_balanced(params: Params, bounds: str) -> str:
    # Before __global__: the source check's CUDA grammar misreads it after the return type.
    attribute = f"__cluster_dims__({params['cluster']}, 1, 1) "
    return (
        f"#define CLUSTER {params['cluster']}  // blocks a cluster: they share its rows' entries evenly\n"
        "#define ROWS (CLUSTER * RPB)  // the cluster's rows\n"
        + _stream_helpers(params)
        + CLUSTER_HELPERS
        + f"""
extern "C" {attribute}__global__ void {bounds} {SIGNATURE}"""
        + """    __shared__ int rp[ROWS + 1];  // the cluster's row pointers (a block's range may span any of its rows)
    __shared__ float acc[ROWS];  // their sums over this block's range of entries
"""
        + PRODUCTS
        + """    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int r0 = blockIdx.x / CLUSTER * ROWS;
    const int n = min(ROWS, nrows - r0);
"""
        + ROWS_IN
        + """    // This block's share of the cluster's entries: as many in every block (to one), whatever the rows.
    const int first = bound(rp[0], rp[n] - rp[0], rank);
    const int last = bound(rp[0], rp[n] - rp[0], rank + 1);
"""
        + TILES
        + """    // The rows this block writes: those starting in its range [first, last), in the last block also those
    // starting at the cluster's end (trailing empty rows); so every row of the cluster exactly once.
    const int mine = first_at(rp, n, first);
    const int past = rank == CLUSTER - 1 ? n : first_at(rp, n, last);
    const int e0 = rp[0];  // read again, not kept in registers through the loop
    const int w = rp[n] - e0;
    cluster.sync();  // every block's acc complete
    for (int i = mine + threadIdx.x; i < past; i += BLOCK) {
        float s = acc[i];
        const int end = rp[i + 1];
        // A row going on past this block's range is the first row of each later block whose range starts inside
        // it: add their sums of it (0 from a block with an empty range: its acc stays zeroed).
        for (int k = rank + 1; k < CLUSTER && bound(e0, w, k) < end; ++k) {
            s += *cluster.map_shared_rank(&acc[i], k);
        }
        y[r0 + i] = from_f(s);
    }
    cluster.sync();  // no block may release its shared memory while another still reads it
}
"""
    )


COMPACT = """
// The threads for which `pick` holds, the first CAP of them in order, into list; how many (in every thread).
// counts: BLOCK / 32 ints, free again on return.
__device__ __forceinline__ int compact(bool pick, int* list, int* counts) {
    const unsigned picks = __ballot_sync(FULL_MASK, pick);
    if ((threadIdx.x & 31) == 0) {
        counts[threadIdx.x >> 5] = __popc(picks);
    }
    __syncthreads();
    int before = 0;
    int total = 0;
    for (int w = 0; w < BLOCK / 32; ++w) {
        before += w < (int)(threadIdx.x >> 5) ? counts[w] : 0;
        total += counts[w];
    }
    const int slot = before + __popc(picks & ((1u << (threadIdx.x & 31)) - 1u));
    if (pick && slot < CAP) {
        list[slot] = (int)threadIdx.x;
    }
    __syncthreads();
    return min(total, CAP);
}
"""


def _spmv_csr_adopt(params: Params, bounds: str) -> str:
    return (
        f"#define LONG {params['long']}  // a row of more entries is long\n"
        f"#define CAP {HANDED}  // a late block's long rows handed over at most (it sums any others itself)\n"
        + _stream_helpers(params)
        + COMPACT
        + f"""
extern "C" __global__ void {bounds} {SIGNATURE}"""
        + BLOCK_ROWS
        + """    __shared__ int handed[CAP];  // a late block's long rows, summed by its adopter
    __shared__ int adopted[CAP];  // an adopter's: its late block's handed rows
    __shared__ int counts[BLOCK / 32];
    __shared__ int adopted_rp[CAP][2];  // the adopted rows' first and last entries
    __shared__ float adopted_acc[CAP];  // and their sums
    // The launch's later half is late: block b's long rows go to block blocks - 1 - b, of the earlier half, which
    // sums them first (the launch's long rows so all start in its first half; its last blocks are light).
    const int blocks = (int)gridDim.x;
    const bool late = (int)blockIdx.x >= blocks - blocks / 2;
    const int r0 = blockIdx.x * RPB;
    const int n = min(RPB, nrows - r0);
    const int ra = (blocks - 1 - (int)blockIdx.x) * RPB;  // an adopter's late block's first row
    const int na = (int)blockIdx.x < blocks / 2 ? min(RPB, nrows - ra) : 0;
    // The late block's row threadIdx.x is long (its pointers loaded with the block's own)? The late block tests its
    // own rows the same way (below): the two must agree on every row.
    bool pick = false;
    if ((int)threadIdx.x < na) {
        pick = row_ptr[ra + threadIdx.x + 1] - row_ptr[ra + threadIdx.x] > LONG;
    }
"""
        + ROWS_IN
        + """    const int adopted_count = compact(pick, adopted, counts);
    const int handed_count = compact(late && (int)threadIdx.x < n && rp[threadIdx.x + 1] - rp[threadIdx.x] > LONG,
                                     handed, counts);
    if ((int)threadIdx.x < adopted_count) {
        const int row = ra + adopted[threadIdx.x];
        adopted_rp[threadIdx.x][0] = row_ptr[row];
        adopted_rp[threadIdx.x][1] = row_ptr[row + 1];
        adopted_acc[threadIdx.x] = 0.0f;
    }
    __syncthreads();
    // The jobs in one loop (one copy of its code): each adopted row, then the runs of the block's rows between the
    // rows it hands over, each streamed as stream streams a block's rows.
    for (int job = 0; job <= adopted_count + handed_count; ++job) {
        const bool own = job >= adopted_count;
        const int run = job - adopted_count;
        const int first = !own ? adopted_rp[job][0] : run == 0 ? rp[0] : rp[handed[run - 1] + 1];
        const int last = !own ? adopted_rp[job][1] : run == handed_count ? rp[n] : rp[handed[run]];
        if (first < last) {  // the same in every thread
            const int* job_rp = own ? rp : adopted_rp[job];
            const int job_rows = own ? n : 1;
            float* job_acc = own ? acc : &adopted_acc[job];
            {
                // The job's rows (these names shadow the block's own).
                const int* rp = job_rp;
                const int n = job_rows;
                float* acc = job_acc;
"""
        + textwrap.indent(TILES, " " * 12)
        + """            }
        }
    }
    if ((int)threadIdx.x < adopted_count) {
        y[ra + adopted[threadIdx.x]] = from_f(adopted_acc[threadIdx.x]);
    }
    for (int i = threadIdx.x; i < n; i += BLOCK) {
        bool kept = true;  // not handed over
        for (int k = 0; k < handed_count; ++k) {
            kept = kept && handed[k] != i;
        }
        if (kept) {
            y[r0 + i] = from_f(acc[i]);
        }
    }
}
"""
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
