"""Suite tasks over sparse matrices: SpMV (y = A x) and SpMM (c = A b, b dense [ncols, k]) with A in CSR, CSC, COO
or ELL.

The matrix. Every input set draws its own matrix, in one of three patterns chosen uniformly (`PATTERNS`):
- uniform: each entry's row and column uniform (Poisson row lengths around the mean, an Erdős-Rényi graph);
- power_law: rows and columns picked with Zipf popularity (1/rank, ranks shuffled), clipped so that no row holds
  more than `max_row` entries (8 sqrt(nnz), at most half the columns: 16384 at 2^22, about 10000 drawn): a few
  very long rows and columns and a few percent empty ones, as graph adjacency matrices have. Long rows are what
  unbalance a thread-per-row kernel;
- banded: entries within `band` of the diagonal (finite-difference and FEM matrices), 64% of the band filled.
With the cards' seeding both seeded sets (seed 1, the timed one, and seed 2) draw power_law, so every task is
timed on the case that breaks a row-per-thread kernel's balance; each fresh set the worker draws has any of the
three with probability 1/3 (tests/suite/tasks/test_sparse.py holds both), so a search meets all of them.
Values are uniform in [-1, 1] divided by sqrt(row length), so every output is about 1/3 in size however long its
row (like a graph network's normalised adjacency) and the tolerance need not grow with the
longest row; x and b are uniform in [-1, 1]. Entries are distinct (no duplicate (row, column)).

The formats (index arrays int32; nnz stored entries, nrows = ncols = nnz / 16, so 16 entries a row on average):
- CSR: values[nnz], col_idx[nnz], row_ptr[nrows + 1]; columns ascending within a row;
- CSC: values[nnz], row_idx[nnz], col_ptr[ncols + 1]; rows ascending within a column;
- COO: values[nnz], row_idx[nnz], col_idx[nnz] sorted by (row, column): coalesced COO, as torch and cuSPARSE keep it;
- ELL: values[nrows, width], col_idx[nrows, width], row-major, width 32 and nrows = ncols = scale / 32; a row's
  entries come first (columns ascending), then padding: column index -1 with value 0. Kernels must never read x
  or b at a padding slot; since padding only trails, a kernel may stop at a row's first -1. nnz = nrows * 8 entries
  (a quarter of the slots) with rows of at most 32, the waste ELL pays for irregular rows.
SpMM has k = 32 dense columns (a graph network's feature width). The scale is the stored entries (nnz; ELL: the
slots nrows * width); spmm's b and c are the largest tensors at twice that (ELL: equal to it).

Baselines are what a student writes in one launch. Outputs are poisoned with NaN before every launch and a plan is
one launch, so an atomicAdd kernel cannot count on a zeroed y: CSR and ELL take a thread per output (row, or
(row, column) for spmm) that sums its row in fp32; COO (sorted by row) takes a thread per output that finds its
row's entries by binary search over row_idx; CSC, whose entries of a row are scattered over every column, takes a
block per slice of output rows that accumulates the slice in shared memory (zeroed there: no memset is needed)
with shared-memory atomics while its threads walk every column, then writes the slice once. That reads A once per
slice, the price of scattering from columns without a second launch; the search may find better. Since every
baseline accumulates in fp32 (registers, or CSC's shared memory) and rounds once on the way out, outputs are in the
precision for every format: no bf16 atomics and no fp32 output is needed.
References are NumPy in float64 (np.bincount over the entries read back from each format's arrays) and share no
code with the baselines; tests/suite/tasks/test_sparse.py holds them against scipy.sparse.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import Distribution, Tolerance
from kernelforge_tui.suite.task import BASELINES, Arrays, Baseline, Precision, Sizes, Task, Tensor, Vendor

PATTERNS = ("uniform", "power_law", "banded")
MEAN_ROW = 16
"""Stored entries per row on average (CSR, CSC, COO): nrows = ncols = nnz / MEAN_ROW."""
ELL_WIDTH = 32
ELL_FILL = 4
"""ELL stores nrows * ELL_WIDTH slots of which one in ELL_FILL holds an entry (8 a row on average)."""
K = 32
"""SpMM's dense columns."""
SLICE = 8192
"""Output values one CSC block accumulates in shared memory (32 KiB of fp32): rows of y, or rows x k of c."""
UNIFORM = Distribution(kind="uniform", low=-1.0, high=1.0)

TOLERANCE: Mapping[Precision, Tolerance] = {
    # fp32: a row's terms are at most 1/sqrt(row length) and its partial sums about 1/3, so an fp32 sum in any order
    # (sequential, tree, atomics) errs by about 2^-24 * sqrt(length) / 3 in absolute terms: 2e-6 for the longest
    # rows at 2^22 (measured 2.1e-6 at most, in row order or shuffled). atol 1e-5 covers that where a row cancels
    # to near zero; a kernel that rounds x or the values to 16 bits errs by 1e-3 and fails.
    "float32": Tolerance(rtol=1e-5, atol=1e-5),
    # bf16: the output's own rounding (2^-9 relative) within PyTorch's rtol; products of bf16 inputs are exact in
    # fp32 and the fp32 sum adds the 2e-6 above, which atol 1e-5 covers for outputs near zero.
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-5),
}


# -- the matrices ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entries:
    """A matrix's stored entries sorted by (row, column): drawn by the generator, or read back from a format."""

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray


def max_row(nnz: int, ncols: int) -> int:
    """The longest row power_law draws (CSR, CSC, COO): a serial loop over it stays within milliseconds."""
    return min(ncols // 2, 8 * math.isqrt(nnz))


def band(nnz: int, nrows: int) -> int:
    """banded's half-width: 3/4 of the mean row, so 2 * band + 1 slots hold the mean at about 64% full."""
    return 3 * (nnz // nrows) // 4


def _zipf(rng: np.random.Generator, n: int, cap: float) -> np.ndarray:
    """Zipf weights 1/rank over shuffled ranks, clipped at `cap` (a share of the total) and renormalised."""
    ranks = np.arange(1, n + 1, dtype=np.float64)
    weights: np.ndarray = rng.permutation(1.0 / ranks)
    weights /= weights.sum()
    while weights.max() > cap * (1 + 1e-9):
        weights = np.minimum(weights, cap)
        weights /= weights.sum()
    return weights


def _popular(rng: np.random.Generator, weights: np.ndarray, count: int) -> np.ndarray:
    """`count` indices drawn with the weights, in ascending order (a multinomial: O(count), not a search per draw)."""
    counts: np.ndarray = rng.multinomial(count, weights)
    return np.repeat(np.arange(weights.size, dtype=np.int32), counts)


def _distinct(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct keys (np.unique without its cost on large int64 arrays)."""
    keys = np.sort(keys)
    first: np.ndarray = np.concatenate([[True], keys[1:] != keys[:-1]])
    return np.compress(first, keys)


def _capped(rng: np.random.Generator, keys: np.ndarray, ncols: int, longest: int) -> np.ndarray:
    """The sorted keys (row * ncols + col) with every row over `longest` entries cut to a random `longest` of them."""
    rows = keys // ncols
    over = (np.bincount(rows) > longest)[rows]
    if not over.any():
        return keys
    heavy, heavy_rows = keys[over], rows[over]
    order = np.lexsort((rng.random(heavy.size), heavy_rows))
    starts = np.concatenate([[0], np.cumsum(np.bincount(heavy_rows))[:-1]])
    rank = np.arange(heavy.size) - starts[heavy_rows[order]]
    return np.sort(np.concatenate([keys[~over], heavy[order][rank < longest]]))


def coordinates(
    rng: np.random.Generator, pattern: str, nrows: int, ncols: int, nnz: int, longest: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exactly nnz distinct (row, column) pairs of the pattern, sorted, no row over `longest`.

    Pairs are drawn a little over what is missing, made distinct and capped, until there are enough; the surplus
    is dropped at random, which keeps the pattern's shape."""
    width = band(nnz, nrows)
    room = nrows * min(longest, 2 * width + 1 if pattern == "banded" else ncols)
    if room < nnz * 5 // 4:
        raise ValueError(f"{nnz} {pattern} entries in {nrows} rows of at most {longest}: too full to draw")
    if pattern == "power_law":
        row_weights = _zipf(rng, nrows, longest / nnz)
        col_weights = _zipf(rng, ncols, longest / nnz)
    keys = np.empty(0, np.int64)
    while keys.size < nnz:
        count = nnz - keys.size + nnz // 8 + 16
        if pattern == "uniform":
            rows, cols = rng.integers(nrows, size=count), rng.integers(ncols, size=count)
        elif pattern == "power_law":
            # Rows in order, columns shuffled: a random pairing of the two draws.
            rows, cols = _popular(rng, row_weights, count), rng.permutation(_popular(rng, col_weights, count))
        else:
            rows = rng.integers(nrows, size=count)
            cols = rows + rng.integers(-width, width + 1, size=count)
            inside = (cols >= 0) & (cols < ncols)
            rows, cols = rows[inside], cols[inside]
        keys = _capped(rng, _distinct(np.concatenate([keys, rows.astype(np.int64) * ncols + cols])), ncols, longest)
    surplus = keys.size - nnz
    if surplus:
        keep = np.ones(keys.size, bool)
        keep[np.argpartition(rng.random(keys.size), surplus)[:surplus]] = False
        keys = keys[keep]
    return keys // ncols, keys % ncols


def pattern_of(rng: np.random.Generator) -> str:
    """The pattern a set's generator draws (its first draw): what the seeded sets are timed on."""
    return PATTERNS[int(rng.integers(len(PATTERNS)))]


def draw_entries(
    rng: np.random.Generator, pattern: str, nrows: int, ncols: int, nnz: int, longest: int, dtype: Any
) -> Entries:
    """A matrix in the pattern, its values rounded to the precision."""
    rows, cols = coordinates(rng, pattern, nrows, ncols, nnz, longest)
    lengths = np.bincount(rows, minlength=nrows)
    values = rng.uniform(-1.0, 1.0, nnz) / np.sqrt(lengths[rows])
    return Entries(rows, cols, values.astype(dtype))


# -- the formats ----------------------------------------------------------------------------------------------------


def _pointers(index: np.ndarray, count: int) -> np.ndarray:
    """Compressed pointers: where each of `count` rows (or columns) starts, and the end."""
    return np.concatenate([[0], np.cumsum(np.bincount(index, minlength=count))]).astype(np.int32)


def _spread(pointers: np.ndarray) -> np.ndarray:
    """The row (or column) of every entry from compressed pointers."""
    lengths: np.ndarray = np.diff(pointers.astype(np.int64))
    return np.repeat(np.arange(pointers.size - 1), lengths)


def pack_csr(e: Entries, sizes: Sizes) -> Arrays:
    return {"values": e.values, "col_idx": e.cols.astype(np.int32), "row_ptr": _pointers(e.rows, sizes["nrows"])}


def read_csr(inputs: Arrays, sizes: Sizes) -> Entries:
    return Entries(_spread(inputs["row_ptr"]), inputs["col_idx"].astype(np.int64), inputs["values"])


def pack_csc(e: Entries, sizes: Sizes) -> Arrays:
    by_column = np.lexsort((e.rows, e.cols))
    return {
        "values": e.values[by_column],
        "row_idx": e.rows[by_column].astype(np.int32),
        "col_ptr": _pointers(e.cols, sizes["ncols"]),
    }


def read_csc(inputs: Arrays, sizes: Sizes) -> Entries:
    return Entries(inputs["row_idx"].astype(np.int64), _spread(inputs["col_ptr"]), inputs["values"])


def pack_coo(e: Entries, sizes: Sizes) -> Arrays:
    return {"values": e.values, "row_idx": e.rows.astype(np.int32), "col_idx": e.cols.astype(np.int32)}


def read_coo(inputs: Arrays, sizes: Sizes) -> Entries:
    return Entries(inputs["row_idx"].astype(np.int64), inputs["col_idx"].astype(np.int64), inputs["values"])


def pack_ell(e: Entries, sizes: Sizes) -> Arrays:
    nrows, width = sizes["nrows"], sizes["width"]
    starts = _pointers(e.rows, nrows)[:-1]
    slots = e.rows * width + (np.arange(e.rows.size) - starts[e.rows])
    values = np.zeros(nrows * width, e.values.dtype)
    col_idx = np.full(nrows * width, -1, np.int32)
    values[slots], col_idx[slots] = e.values, e.cols
    return {"values": values.reshape(nrows, width), "col_idx": col_idx.reshape(nrows, width)}


def read_ell(inputs: Arrays, sizes: Sizes) -> Entries:
    stored = inputs["col_idx"] >= 0
    rows, _ = np.nonzero(stored)
    return Entries(rows, inputs["col_idx"][stored].astype(np.int64), inputs["values"][stored])


# -- the references -------------------------------------------------------------------------------------------------


def multiply(e: Entries, rhs: np.ndarray, nrows: int) -> np.ndarray:
    """A @ rhs in float64: every entry's product summed into its row (rhs a vector, or k columns one at a time)."""
    values = e.values.astype(np.float64)
    dense = rhs.astype(np.float64)
    if dense.ndim == 1:
        return np.bincount(e.rows, weights=values * dense[e.cols], minlength=nrows)
    columns = [np.bincount(e.rows, weights=values * dense[e.cols, j], minlength=nrows) for j in range(dense.shape[1])]
    return np.stack(columns, axis=1)


# -- the tasks ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """What a storage format fixes for its SpMV and SpMM tasks: tensors, sizes, packing, reading back, vendor."""

    name: str
    storage: str
    """The format's index arrays and layout, in words."""
    index: tuple[Tensor, ...]
    sizes: Callable[[int], Sizes]
    pack: Callable[[Entries, Sizes], Arrays]
    read: Callable[[Arrays, Sizes], Entries]
    longest: Callable[[Sizes], int]
    sparse: Callable[[Any, Mapping[str, Any], Sizes], Any] | None
    """The matrix as a torch sparse tensor (cuSPARSE behind torch's products), or None: torch has no such layout."""
    bytes: str | None = None
    """The bytes a correct kernel must move, before the dense operand and the output; None: every tensor once."""


def _compressed_sizes(scale: int) -> Sizes:
    return {"nrows": scale // MEAN_ROW, "ncols": scale // MEAN_ROW, "nnz": scale}


def _ell_sizes(scale: int) -> Sizes:
    nrows = scale // ELL_WIDTH
    return {"nrows": nrows, "ncols": nrows, "width": ELL_WIDTH, "nnz": nrows * ELL_WIDTH // ELL_FILL}


VALUES = Tensor("values", ("nnz",), distribution=UNIFORM)

CSR = Format(
    name="csr",
    storage="CSR: values[nnz], col_idx[nnz], row_ptr[nrows + 1] (int32), columns ascending within a row",
    index=(VALUES, Tensor("col_idx", ("nnz",), "int32"), Tensor("row_ptr", ("nrows + 1",), "int32")),
    sizes=_compressed_sizes,
    pack=pack_csr,
    read=read_csr,
    longest=lambda sizes: max_row(sizes["nnz"], sizes["ncols"]),
    sparse=lambda torch, t, sizes: torch.sparse_csr_tensor(
        t["row_ptr"], t["col_idx"], t["values"], (sizes["nrows"], sizes["ncols"]), check_invariants=False
    ),
)
CSC = Format(
    name="csc",
    storage="CSC: values[nnz], row_idx[nnz], col_ptr[ncols + 1] (int32), rows ascending within a column",
    index=(VALUES, Tensor("row_idx", ("nnz",), "int32"), Tensor("col_ptr", ("ncols + 1",), "int32")),
    sizes=_compressed_sizes,
    pack=pack_csc,
    read=read_csc,
    longest=CSR.longest,
    sparse=lambda torch, t, sizes: torch.sparse_csc_tensor(
        t["col_ptr"], t["row_idx"], t["values"], (sizes["nrows"], sizes["ncols"]), check_invariants=False
    ),
)
COO = Format(
    name="coo",
    storage="COO: values[nnz], row_idx[nnz], col_idx[nnz] (int32) sorted by (row, column)",
    index=(VALUES, Tensor("row_idx", ("nnz",), "int32"), Tensor("col_idx", ("nnz",), "int32")),
    sizes=_compressed_sizes,
    pack=pack_coo,
    read=read_coo,
    longest=CSR.longest,
    # torch's COO holds int64 indices: the widening is part of the vendor's time. No invariant checks (a pass over
    # the indices) in any of the three: the generator keeps them.
    sparse=lambda torch, t, sizes: torch.sparse_coo_tensor(
        torch.stack([t["row_idx"], t["col_idx"]]).long(),
        t["values"],
        (sizes["nrows"], sizes["ncols"]),
        is_coalesced=True,
        check_invariants=False,
    ),
)
ELL = Format(
    name="ell",
    storage=(
        "ELL: values[nrows, width], col_idx[nrows, width] (int32), row-major; a row's entries first, then padding "
        "(column -1, value 0); nnz = a quarter of the slots hold entries"
    ),
    index=(
        Tensor("values", ("nrows", "width"), distribution=UNIFORM),
        Tensor("col_idx", ("nrows", "width"), "int32"),
    ),
    sizes=_ell_sizes,
    pack=pack_ell,
    read=read_ell,
    longest=lambda sizes: min(sizes["width"], sizes["ncols"] // 2),
    sparse=None,
    # A kernel that stops at a row's first padding slot reads about the entries alone, and must not look faster
    # than the copy ceiling: the bytes are the entries (a 4-byte index and a value of the precision each), then x or
    # b and the output once (spmv, spmm add). E is the precision's element size.
    bytes="nnz * (4 + E)",
)


def _draw(fmt: Format, spmm: bool) -> Callable[[np.random.Generator, Sizes, Precision], Arrays]:
    """The generator of a task: the matrix in the format, and x (spmv) or b (spmm) uniform in [-1, 1]."""

    def generate(rng: np.random.Generator, sizes: Sizes, precision: Precision) -> Arrays:
        dtype = NUMPY[precision]
        pattern = pattern_of(rng)
        e = draw_entries(rng, pattern, sizes["nrows"], sizes["ncols"], sizes["nnz"], fmt.longest(sizes), dtype)
        dense = {"b": (sizes["ncols"], sizes["k"])} if spmm else {"x": (sizes["ncols"],)}
        return {**fmt.pack(e, sizes), **{n: rng.uniform(-1.0, 1.0, s).astype(dtype) for n, s in dense.items()}}

    return generate


NO_ELL_VENDOR = (
    " No vendor: torch has no ELL layout (cuSPARSE's Blocked-ELL, dense blocks rather than rows, is not reachable "
    "through it)."
)
PATTERN_WORDS = (
    "Each input set draws its matrix as uniform, power_law (Zipf rows and columns, a few very long, some empty) or "
    "banded with probability 1/3 each; the seeded sets (seed 1 is timed) are power_law."
)
CHECK = (
    "every output against the float64 reference within the tolerance: fp32 rtol 1e-5, atol 1e-5 (values scaled by "
    "1/sqrt(row length) keep outputs about 1/3 in size, and an fp32 sum of up to max_row terms in any order errs "
    "by about 2e-6 at most); bf16 rtol 1.6e-2 for the output's rounding. Empty rows must be written as 0."
)


def product(fmt: Format, baseline: Baseline, spmm: bool = False) -> Task:
    """spmv (y = A x) or spmm (c = A b, k columns) with A in the format."""
    dense, out = ("b", "c") if spmm else ("x", "y")
    columns = ("k",) if spmm else ()
    per_column = " * k" if spmm else ""
    sparse = fmt.sparse
    vendor = None
    if sparse is not None:
        vendor = Vendor("cuSPARSE (torch.sparse)", lambda torch, t, sizes: {out: sparse(torch, t, sizes) @ t[dense]})
    return Task(
        name=f"{'spmm' if spmm else 'spmv'}_{fmt.name}",
        family="sparse",
        summary=f"{out} = A {dense} with A in {fmt.name.upper()}"
        + (f" and b dense [ncols, {K}]" if spmm else "")
        + " (fp32 accumulation)",
        sizes=(lambda scale: {**fmt.sizes(scale), "k": K}) if spmm else fmt.sizes,
        inputs=(*fmt.index, Tensor(dense, ("ncols", *columns), distribution=UNIFORM)),
        outputs=(Tensor(out, ("nrows", *columns)),),
        flops=f"2 * nnz{per_column}",
        baseline=baseline,
        reference=lambda inputs, sizes: {out: multiply(fmt.read(inputs, sizes), inputs[dense], sizes["nrows"])},
        check=CHECK,
        generate=_draw(fmt, spmm),
        tolerance=TOLERANCE,
        vendor=vendor,
        bytes=None
        if fmt.bytes is None
        else {
            precision: f"{fmt.bytes} + (ncols + nrows){per_column} * E".replace("E", str(size))
            for precision, size in ELEMENT_SIZE.items()
        },
        description=f"{fmt.storage}{'; b row-major [ncols, k]' if spmm else ''}. {PATTERN_WORDS}"
        + ("" if sparse else NO_ELL_VENDOR),
    )


ELEMENT_SIZE: dict[Precision, int] = {"float32": 4, "bfloat16": 2}


def _plan(file: str, entry: str, grid: str, args: tuple[str, ...]) -> Baseline:
    """The baseline in cuda/FILE (the CSC ones own SLICE outputs a block)."""
    return Baseline(source=BASELINES.render(file, slice=SLICE), entry=entry, grid=(grid,), block=(256,), args=args)


ROWS = "cdiv(nrows, 256)"
OUTPUTS = "cdiv(nrows * k, 256)"

TASKS: tuple[Task, ...] = (
    product(CSR, _plan("spmv_csr.cu", "spmv_csr_naive", ROWS, ("values", "col_idx", "row_ptr", "x", "y", "nrows"))),
    product(
        CSC,
        _plan(
            "spmv_csc.cu",
            "spmv_csc_naive",
            f"cdiv(nrows, {SLICE})",
            ("values", "row_idx", "col_ptr", "x", "y", "nrows", "ncols"),
        ),
    ),
    product(
        COO, _plan("spmv_coo.cu", "spmv_coo_naive", ROWS, ("values", "row_idx", "col_idx", "x", "y", "nrows", "nnz"))
    ),
    product(ELL, _plan("spmv_ell.cu", "spmv_ell_naive", ROWS, ("values", "col_idx", "x", "y", "nrows", "width"))),
    product(
        CSR,
        _plan("spmm_csr.cu", "spmm_csr_naive", OUTPUTS, ("values", "col_idx", "row_ptr", "b", "c", "nrows", "k")),
        spmm=True,
    ),
    product(
        CSC,
        _plan(
            "spmm_csc.cu",
            "spmm_csc_naive",
            f"cdiv(nrows, {SLICE} // k)",
            ("values", "row_idx", "col_ptr", "b", "c", "nrows", "ncols", "k"),
        ),
        spmm=True,
    ),
    product(
        COO,
        _plan(
            "spmm_coo.cu", "spmm_coo_naive", OUTPUTS, ("values", "row_idx", "col_idx", "b", "c", "nrows", "k", "nnz")
        ),
        spmm=True,
    ),
    product(
        ELL,
        _plan("spmm_ell.cu", "spmm_ell_naive", OUTPUTS, ("values", "col_idx", "b", "c", "nrows", "width", "k")),
        spmm=True,
    ),
)
