"""Sparse products with fp32 accumulation: CSR SpMV (a lane group per row, a block's entries shared evenly by its
threads, a cluster's entries shared evenly by its blocks, or the launch's late long rows summed by its early
blocks), ELL SpMV, CSR SpMM. The kernels are cuda/spmv_csr_<strategy>.cu, spmv_ell.cu and spmm_csr.cu, with the
pieces they share in cuda/sparse_*.cuh and spmv_csr_*.cuh.

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
- `balanced`: the stream kernel's blocks are uneven (one owning a row of 65536 entries has ~8x the average block's
  work on the suite's power-law card, and started late it is the launch's tail), so a thread block cluster of
  `cluster` blocks (2, 4 or 8: portable sizes) owns cluster * rpb consecutive rows and splits their W entries evenly
  by count, not by rows: block k streams entries [E0 + W * k / cluster, E0 + W * (k + 1) / cluster) (E0 the cluster's
  first entry; 64-bit products) exactly as a stream block streams its rows' (the same tiles and loop, one copy:
  cuda/spmv_csr_tile_loop.cuh), so a long row's entries are shared by the cluster's blocks and no block is a tail.
  Each block's shared sums then hold its range's part of every row it touches; after cluster.sync() each row is
  written once, by the block whose range holds the row's first entry (rows starting at the cluster's end, its trailing
  empty rows, by the last block; an empty row as 0), adding the parts of the later blocks whose ranges start inside
  the row (their first row), read through distributed shared memory (map_shared_rank); a second cluster.sync() keeps
  every block's shared memory until the others have read it. Blocks with an empty range (a cluster of fewer entries
  than blocks) add zeros. Each block keeps the row pointers and sums of all the cluster's rows (a block's range may
  hold most of them when another's is one long row): cluster * rpb rows within the static shared memory. That fixed
  cost per block grows with the cluster while the block's entries shrink, and dynamic shared memory for more rows
  would cost occupancy (every block keeps a copy of its cluster's rows). Stream and cuSPARSE both run at the L2's
  limit: what stream lacks is the tail, blocks with a long row started last.
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

from typing import ClassVar, Literal

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
    TemplateParams,
    describe,
    dtype_of,
    prelude_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import Value, render

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
"""The strategies that stream entries in tiles (one loop, cuda/spmv_csr_tile_loop.cuh)."""
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
CSR_FILES = {
    "vector": "spmv_csr_vector.cu",
    "stream": "spmv_csr_stream.cu",
    "balanced": "spmv_csr_balanced.cu",
    "adopt": "spmv_csr_adopt.cu",
    "paired": "spmv_csr_stream.cu",
}
"""CSR SpMV's kernel file of each strategy (paired is stream with the row blocks of each pair reordered)."""
OTHER_FILES = {"spmv_ell": "spmv_ell.cu", "spmm_csr": "spmm_csr.cu"}
ARGS = {
    "spmv_csr": ["values", "col_idx", "row_ptr", "x", "y", "nrows"],
    "spmv_ell": ["values", "col_idx", "x", "y", "nrows"],
    "spmm_csr": ["values", "col_idx", "row_ptr", "b", "c", "nrows"],
}
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


class SpmvCsrParams(TemplateParams):
    strategy: Literal["vector", "stream", "balanced", "adopt", "paired"]
    tpr: int
    rpb: int
    unroll: int
    block: int
    items: int
    vec: int
    hint: Literal["plain", "stream"]
    minb: int
    cluster: int
    long: int

    @property
    def tiled(self) -> bool:
        """Whether the strategy is one of the tiled ones (all but vector)."""
        return self.strategy in TILED


class SpmvEllParams(TemplateParams):
    tpr: int
    rpb: int
    unroll: int
    pad: Literal["skip", "stop"]


class SpmmCsrParams(TemplateParams):
    vec: int
    split: int
    rpb: int
    unroll: int


SparseParams = SpmvCsrParams | SpmvEllParams | SpmmCsrParams
PARAMS: dict[str, type[SparseParams]] = {
    "spmv_csr": SpmvCsrParams,
    "spmv_ell": SpmvEllParams,
    "spmm_csr": SpmmCsrParams,
}


def _lanes(params: SparseParams, card: OperatorCard) -> int:
    """Lanes that share one row (lane-group kernels)."""
    if isinstance(params, SpmmCsrParams):
        return card.sizes["k"] // params.vec * params.split
    return params.tpr


def _threads(params: SparseParams, card: OperatorCard) -> int:
    """Threads a block."""
    if isinstance(params, SpmvCsrParams) and params.tiled:
        return params.block
    return _lanes(params, card) * params.rpb


def stream_shared_bytes(rows: int, block: int, items: int, direct: bool, adopt: bool) -> int:
    """The tiled kernels' shared memory: the row pointers and sums of `rows` rows (the block's; balanced: its
    cluster's, any of which its range may hold), and a tile's products (a pad word every 32: SKEW, in
    cuda/spmv_csr_stream_helpers.cuh) unless each thread sums only the entries it loaded (`direct`)."""
    tile = 0 if direct else block * items
    # adopt: the handed rows, the adopted rows with their first and last entries and sums, the warps' counts.
    lists = 5 * HANDED + block // 32 if adopt else 0
    return 4 * ((rows + 1) + rows + tile + max(0, tile - 1) // 32 + lists)


def csr_shared_bytes(params: SpmvCsrParams) -> int:
    """A tiled CSR SpMV kernel's shared memory (see stream_shared_bytes)."""
    rows = params.rpb * (params.cluster if params.strategy == "balanced" else 1)
    direct = params.items == params.vec  # DIRECT: each thread's products stay in its registers
    return stream_shared_bytes(rows, params.block, params.items, direct, params.strategy == "adopt")


class SparseTemplate(Template[SparseParams]):
    name = "sparse"
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

    def params_type(self, card: OperatorCard) -> type[SparseParams]:
        return PARAMS[_kind(card)]

    def canonical(self, card: OperatorCard, params: SparseParams) -> SparseParams:
        """ELL: a lane has width / tpr slots, so unrolling past them changes nothing. CSR SpMV: the parameters a
        strategy does not use are fixed at their first values (balanced uses stream's and its cluster)."""
        if isinstance(params, SpmvCsrParams):
            return params.but(**UNUSED_BY[params.strategy])
        if isinstance(params, SpmmCsrParams):
            return params
        slots = card.sizes["width"] // params.tpr
        return params.but(unroll=max(u for u in UNROLLS if u <= max(1, min(slots, params.unroll))))

    def problem(self, card: OperatorCard, params: SparseParams) -> str | None:
        if isinstance(params, SpmmCsrParams):
            k, vec = card.sizes["k"], params.vec
            if k % vec:
                return f"vec {vec} does not divide k = {k}: a row of b would end inside a vector"
            columns = k // vec
            if columns & (columns - 1) or columns * params.split > 32:
                return f"k / vec * split = {columns * params.split} lanes a row: not a power of two <= 32"
        elif isinstance(params, SpmvEllParams) and params.tpr > card.sizes["width"]:
            return f"tpr {params.tpr} > width {card.sizes['width']}: lanes with no slot"
        elif isinstance(params, SpmvCsrParams):
            vec, nnz = params.vec, card.sizes["nnz"]
            if nnz % vec:
                return f"vec {vec} does not divide nnz = {nnz}: the last chunk would read past the arrays"
            if params.tiled and params.items % vec:
                return f"items {params.items} is not a whole number of vec {vec} chunks"
            if params.strategy == "adopt" and params.rpb > params.block:
                return f"adopt: rpb {params.rpb} > block {params.block} (a thread tests one row of each block)"
            if params.tiled and (shared := csr_shared_bytes(params)) > STATIC_SHARED:
                return f"{shared} bytes of shared memory a block: over the {STATIC_SHARED} it may declare"
            if params.minb * _threads(params, card) > THREADS_PER_SM:
                return f"minb {params.minb} x {_threads(params, card)} threads exceeds {THREADS_PER_SM} an SM"
        threads = _threads(params, card)
        if not 32 <= threads <= 1024:
            return f"{threads} threads a block (lanes a row x rpb) outside 32..1024"
        return None

    def render(self, card: OperatorCard, params: SparseParams) -> tuple[str, LaunchPlan]:
        kind = _kind(card)
        lanes, threads = _lanes(params, card), _threads(params, card)
        csr = params if isinstance(params, SpmvCsrParams) else None
        strategy = csr.strategy if csr is not None else ""
        # `cluster` and `long` named only where used: the older kernels' sources predate them (the renders stay as
        # they were: a change would be a new version).
        used = {"cluster": strategy == "balanced", "long": strategy == "adopt"}
        values: dict[str, Value] = {
            **prelude_values(dtype_of(card), params.vec if not isinstance(params, SpmvEllParams) else 1),
            "kind": kind,
            "named": describe({k: v for k, v in params.as_dict().items() if used.get(k, True)}),
            "rpb": params.rpb,
            "lane_groups": csr is None or not csr.tiled,
            "lanes": lanes,
            "block": threads,
            "minb": csr.minb if csr is not None else 1,
            "unroll": params.unroll,
        }
        if isinstance(params, SpmmCsrParams):
            source = render("spmm_csr.cu", **values, column_lanes=lanes // params.split, split=params.split)
        elif isinstance(params, SpmvEllParams):
            source = render("spmv_ell.cu", **values, width=card.sizes["width"], stop=params.pad == "stop")
        else:
            source = render(
                CSR_FILES[params.strategy],
                **values,
                stream_hint=params.hint == "stream",
                items=params.items,
                paired=params.strategy == "paired",
                clustered=params.strategy == "balanced",
                cluster=params.cluster,
                long=params.long,
                cap=HANDED,
            )
        # balanced: a cluster of `cluster` blocks a cluster * rpb rows.
        grid = (
            f"cdiv(nrows, {params.rpb * csr.cluster}) * {csr.cluster}"
            if csr is not None and strategy == "balanced"
            else f"cdiv(nrows, {params.rpb})"
        )
        plan = LaunchPlan(entry=f"kf_{kind}", grid=[grid], block=[threads], args=ARGS[kind])
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


def _cluster_rows_for(card: OperatorCard, block: int, items: int, cluster: int, entries: int) -> int:
    """balanced: the rows per block whose cluster's entries, at the card's mean row length, make about `entries`,
    within the shared memory of a block's rows and tile (problem() then holds the cluster's rows to it)."""
    mean = max(1, card.sizes["nnz"] // max(1, card.sizes["nrows"]))
    fits = [r for r in ROWS_PER_BLOCK if stream_shared_bytes(r, block, items, False, False) <= STATIC_SHARED] or [1]
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
    balanced = [  # block, items, minb, cluster, and the cluster's entries at the mean row
        (512, 8, full // 512, 2, 16384),
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
    adopts: list[Params] = [  # rows per block at most one a thread (compact in cuda/spmv_csr_adopt.cu)
        {"block": 256, "items": max(4, wide), "rpb": min(256, _rows_for(card, 4096)), "minb": 4, "long": 4096},
        {"block": 512, "items": wide, "rpb": min(512, _rows_for(card, 8192)), "minb": 2, "long": 4096},
    ]
    tiled: Params = {"vec": wide, "hint": "stream"}
    return [
        *({"strategy": "adopt", **tiled, **UNUSED_BY_ADOPT, **p} for p in adopts),
        *({"strategy": "stream", **tiled, **UNUSED_BY_STREAM, **p} for p in streams),
        *(
            {
                "strategy": "balanced",
                **tiled,
                **UNUSED_BY_BALANCED,
                **{"block": block, "items": items, "minb": minb, "cluster": cluster},
                "rpb": _cluster_rows_for(card, block, items, cluster, entries),
            }
            for block, items, minb, cluster, entries in balanced
        ),
        *({"strategy": "vector", "hint": "stream", **UNUSED_BY_VECTOR, **p} for p in vectors),
    ]
