"""The sparse suite tasks: references against scipy.sparse (and an explicit loop for ELL) in every format and
pattern, the generator's invariants (exact nnz, monotone pointers, indices in range, ascending, ELL padding), the
patterns the seeded and fresh sets draw, the tolerance against fp32 sums in other orders and against a precision
downgrade, the bytes a correct kernel must move, the vendor through torch (on the CPU), and the sparse template:
the cards it serves, its rules, and seeds that build with nvcc."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse  # type: ignore[import-untyped]

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.sparse import SparseTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Arrays, Precision, Sizes, Task
from kernelforge_tui.suite.tasks import sparse
from tests.conftest import typed

NAMES = [t.name for t in sparse.TASKS]
SMALL = 2**10
FORMATS = {f.name: f for f in (sparse.CSR, sparse.CSC, sparse.COO, sparse.ELL)}


def fmt_of(case: Task) -> sparse.Format:
    return FORMATS[case.name.split("_")[1]]


def drawn(case: Task, pattern: str, scale: int = SMALL, precision: Precision = "float32") -> tuple[Arrays, Sizes]:
    """The task's own generator on a stream whose first draw picks `pattern`."""
    sizes = case.sizes(scale)
    seed = next(s for s in range(100) if sparse.pattern_of(np.random.default_rng(s)) == pattern)
    assert case.generate is not None
    return case.generate(np.random.default_rng(seed), sizes, precision), sizes


def scipy_matrix(name: str, inputs: Arrays, sizes: Sizes) -> scipy.sparse.sparray:
    """The matrix as scipy reads each format (ELL by an explicit loop over its slots)."""
    shape = (sizes["nrows"], sizes["ncols"])
    values = inputs["values"].astype(np.float64)
    if name == "csr":
        return scipy.sparse.csr_array((values, inputs["col_idx"], inputs["row_ptr"]), shape=shape)
    if name == "csc":
        return scipy.sparse.csc_array((values, inputs["row_idx"], inputs["col_ptr"]), shape=shape)
    if name == "coo":
        return scipy.sparse.coo_array((values, (inputs["row_idx"], inputs["col_idx"])), shape=shape)
    dense = np.zeros(shape)
    for r in range(shape[0]):
        for s in range(sizes["width"]):
            if inputs["col_idx"][r, s] >= 0:
                dense[r, inputs["col_idx"][r, s]] += values[r, s]
    return scipy.sparse.csr_array(dense)


@pytest.mark.parametrize("pattern", sparse.PATTERNS)
@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_scipy(name: str, pattern: str) -> None:
    case = task(name)
    inputs, sizes = drawn(case, pattern, precision="bfloat16")
    (expected,) = case.reference(inputs, sizes).values()
    dense = inputs["x"] if "x" in inputs else inputs["b"]
    want = scipy_matrix(fmt_of(case).name, inputs, sizes) @ dense.astype(np.float64)
    assert expected.shape == want.shape
    np.testing.assert_allclose(expected, want, rtol=1e-12, atol=1e-12)
    assert np.abs(want).max() > 0.1, "a product that is not all zeros"


@pytest.mark.parametrize("pattern", sparse.PATTERNS)
def test_every_format_stores_the_same_matrix(pattern: str) -> None:
    """One drawn matrix packed in each format reads back to the same entries (and scipy agrees on the product)."""
    sizes = sparse.CSR.sizes(SMALL)
    e = sparse.draw_entries(np.random.default_rng(3), pattern, sizes["nrows"], sizes["ncols"], sizes["nnz"], 24, "f8")
    products = []
    for fmt in (sparse.CSR, sparse.CSC, sparse.COO):
        back = fmt.read(fmt.pack(e, sizes), sizes)
        order = np.lexsort((back.cols, back.rows))
        assert np.array_equal(back.rows[order], e.rows) and np.array_equal(back.cols[order], e.cols)
        assert np.array_equal(back.values[order], e.values)
        products.append(scipy_matrix(fmt.name, fmt.pack(e, sizes), sizes).toarray())
    assert all(np.array_equal(products[0], p) for p in products[1:])


def check_entries(rows: np.ndarray, cols: np.ndarray, sizes: Sizes) -> None:
    """Sorted by (row, column) without repeats, every index in range."""
    assert rows.min() >= 0 and rows.max() < sizes["nrows"] and cols.min() >= 0 and cols.max() < sizes["ncols"]
    keys = rows.astype(np.int64) * sizes["ncols"] + cols
    assert np.all(np.diff(keys) > 0), "entries ascend by (row, column) and none repeats"


def check_pointers(pointers: np.ndarray, count: int, nnz: int) -> None:
    assert pointers.dtype == np.int32 and pointers.shape == (count + 1,)
    assert pointers[0] == 0 and pointers[-1] == nnz and np.all(np.diff(pointers) >= 0)


@pytest.mark.parametrize("pattern", sparse.PATTERNS)
@pytest.mark.parametrize("name", ["spmv_csr", "spmv_csc", "spmv_coo", "spmv_ell"])
def test_generator_invariants(name: str, pattern: str) -> None:
    case = task(name)
    inputs, sizes = drawn(case, pattern, scale=2**14)
    nnz = sizes["nnz"]
    if name == "spmv_csr":
        check_pointers(inputs["row_ptr"], sizes["nrows"], nnz)
        rows = np.repeat(np.arange(sizes["nrows"]), np.diff(inputs["row_ptr"]))
        check_entries(rows, inputs["col_idx"], sizes)
    elif name == "spmv_csc":
        check_pointers(inputs["col_ptr"], sizes["ncols"], nnz)
        cols = np.repeat(np.arange(sizes["ncols"]), np.diff(inputs["col_ptr"]))
        check_entries(cols, inputs["row_idx"], {"nrows": sizes["ncols"], "ncols": sizes["nrows"]})
        rows = inputs["row_idx"]
    elif name == "spmv_coo":
        rows = inputs["row_idx"]
        check_entries(rows, inputs["col_idx"], sizes)
    else:
        col_idx, values = inputs["col_idx"], inputs["values"]
        padding = col_idx < 0
        assert np.all(col_idx[padding] == -1) and np.all(values[padding] == 0), "padding is column -1, value 0"
        assert not np.any(padding[:, :-1] & ~padding[:, 1:]), "padding only trails a row's entries"
        assert np.count_nonzero(~padding) == nnz, "exactly nnz entries"
        rows = np.nonzero(~padding)[0]
        check_entries(rows, col_idx[~padding], sizes)
    lengths = np.bincount(rows, minlength=sizes["nrows"])
    assert lengths.sum() == nnz and lengths.max() <= fmt_of(case).longest(sizes)
    values = inputs["values"][inputs["col_idx"] >= 0] if name == "spmv_ell" else inputs["values"]
    assert np.all(np.abs(values.astype(np.float64)) <= 1 / np.sqrt(lengths[rows])), "values scale by 1/sqrt(row)"
    if pattern == "banded":
        e = fmt_of(case).read(inputs, sizes)
        assert np.abs(e.cols - e.rows).max() <= sparse.band(nnz, sizes["nrows"])
    if pattern == "power_law" and name != "spmv_ell":
        assert lengths.max() > 8 * nnz / sizes["nrows"], "a few very long rows"
        assert (lengths == 0).any(), "and some empty ones"


def test_ell_power_law_fills_some_rows_to_the_width() -> None:
    inputs, sizes = drawn(task("spmv_ell"), "power_law", scale=2**14)
    lengths = (inputs["col_idx"] >= 0).sum(axis=1)
    assert lengths.max() == sizes["width"] and np.median(lengths) < sizes["width"] / 4


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The patterns the generator draws, as it draws them."""
    seen: list[str] = []
    original = sparse.pattern_of

    def record(rng: np.random.Generator) -> str:
        seen.append(original(rng))
        return seen[-1]

    monkeypatch.setattr(sparse, "pattern_of", record)
    yield seen


def test_the_seeded_sets_are_power_law_and_fresh_sets_meet_every_pattern(recorded: list[str]) -> None:
    """The cards' seeds 1 (timed) and 2 draw power_law through Task.draw's own seeding; other seeds, as the worker's
    fresh sets, draw all three."""
    case = task("spmv_csr")
    sizes = case.sizes(SMALL)
    for seed in cards.SEEDS:
        case.draw(sizes, "float32", seed)
    assert recorded == ["power_law"] * len(cards.SEEDS)
    for seed in range(100, 112):
        case.draw(sizes, "float32", seed)
    assert set(recorded[len(cards.SEEDS) :]) == set(sparse.PATTERNS)


def test_a_pattern_too_full_to_draw_is_refused() -> None:
    with pytest.raises(ValueError, match="too full"):
        sparse.coordinates(np.random.default_rng(0), "uniform", 8, 8, 60, 4)


def fp32_row_sums(e: sparse.Entries, x: np.ndarray, nrows: int, reverse: bool) -> np.ndarray:
    """What a kernel summing each row in fp32 gives: one entry a step, in row order or reversed."""
    products = e.values.astype(np.float32) * x.astype(np.float32)[e.cols]
    starts = np.concatenate([[0], np.cumsum(np.bincount(e.rows, minlength=nrows))])
    lengths = np.diff(starts)
    sums = np.zeros(nrows, np.float32)
    for step in range(lengths.max()):
        live = np.nonzero(lengths > step)[0]
        at = starts[live + 1] - 1 - step if reverse else starts[live] + step
        sums[live] += products[at]
    return sums


@pytest.mark.parametrize("pattern", sparse.PATTERNS)
def test_the_fp32_tolerance_admits_any_order_and_refuses_a_downgrade(pattern: str) -> None:
    case = task("spmv_csr")
    inputs, sizes = drawn(case, pattern, scale=2**14)
    e = sparse.CSR.read(inputs, sizes)
    want = case.reference(inputs, sizes)["y"]
    tolerance = case.tolerance["float32"]
    for reverse in (False, True):
        assert tolerance.accepts(fp32_row_sums(e, inputs["x"], sizes["nrows"], reverse), want).all()
    x_in_bf16 = inputs["x"].astype(NUMPY["bfloat16"])
    assert not tolerance.accepts(fp32_row_sums(e, x_in_bf16, sizes["nrows"], False), want).all()


def sectors(cols: np.ndarray, row_bytes: int) -> int:
    """Bytes of a dense operand in the 32-byte sectors (what a GPU reads) its used rows fall in."""
    if row_bytes >= 32:  # rows of b: whole sectors each
        return int(np.unique(cols).size * row_bytes)
    return int(np.unique(cols * row_bytes // 32).size * 32)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_the_bytes_are_no_more_than_a_correct_kernel_moves(name: str, precision: Precision) -> None:
    """The ceiling check fails a kernel faster than the copy rate over these bytes: they must not count what a
    correct kernel may skip (ELL's padding; rows of b no entry uses, a few percent under power_law)."""
    case = task(name)
    inputs, sizes = drawn(case, "power_law", scale=2**14, precision=precision)
    spec = cards.spec(case, precision, 2**14)
    e = fmt_of(case).read(inputs, sizes)
    element = NUMPY[precision].itemsize
    per_entry = (8 if fmt_of(case) is sparse.COO else 4) + element
    pointers = sum(inputs[p].nbytes for p in ("row_ptr", "col_ptr") if p in inputs)
    k = sizes.get("k", 1)
    needed = e.rows.size * per_entry + pointers + sectors(e.cols, k * element) + sizes["nrows"] * k * element
    assert spec.bytes_moved() <= needed * 1.02, "b counted whole: 2% for its unused rows, far under the 10% margin"


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_the_vendor_agrees_with_the_reference_through_torch() -> None:
    torch = pytest.importorskip("torch")
    for case in sparse.TASKS:
        if fmt_of(case) is sparse.ELL:
            assert case.vendor is None and "torch has no ELL" in case.description
            continue
        assert case.vendor is not None
        inputs, sizes = drawn(case, "power_law")
        (out, want), = case.reference(inputs, sizes).items()  # fmt: skip
        got = case.vendor.run(torch, {k: torch.from_numpy(v) for k, v in inputs.items()}, sizes)[out]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


# -- the template ---------------------------------------------------------------------------------------------------


def card(name: str, precision: Precision = "float32", scale: int = SMALL) -> OperatorCard:
    return cards.spec(task(name), precision, scale)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_template_serves_csr_and_ell_spmv_and_csr_spmm(precision: Precision) -> None:
    served = {name for name in NAMES if template_for(card(name, precision)) is not None}
    assert served == {"spmv_csr", "spmv_ell", "spmm_csr"}
    assert all(isinstance(template_for(card(n, precision)), SparseTemplate) for n in served)
    why = TemplateProposer().cannot_serve(card("spmv_csc", precision))
    assert why is not None and "CSC and COO have no template" in why


def test_the_template_rules() -> None:
    template = SparseTemplate()
    spmm, ell, csr = card("spmm_csr"), card("spmv_ell"), card("spmv_csr")
    assert template.problem(spmm, typed(template, spmm, {"vec": 4, "split": 8, "rpb": 8, "unroll": 1})) is not None, (
        "8 x 8 lanes a row"
    )
    assert template.problem(spmm, typed(template, spmm, {"vec": 4, "split": 4, "rpb": 8, "unroll": 1})) is None
    odd_k = spmm.model_copy(update={"sizes": {**spmm.sizes, "k": 12}})
    assert "does not divide" in str(
        template.problem(odd_k, typed(template, odd_k, {"vec": 8, "split": 1, "rpb": 8, "unroll": 1}))
    )
    assert "power of two" in str(
        template.problem(odd_k, typed(template, odd_k, {"vec": 4, "split": 1, "rpb": 32, "unroll": 1}))
    )
    lane_groups = {"strategy": "vector", "block": 128, "items": 4, "vec": 1, "hint": "plain", "minb": 1,
                   "cluster": 2, "long": 256}  # fmt: skip
    assert "32..1024" in str(
        template.problem(csr, typed(template, csr, {**lane_groups, "tpr": 1, "rpb": 16, "unroll": 1}))
    )
    assert "32..1024" in str(
        template.problem(csr, typed(template, csr, {**lane_groups, "tpr": 32, "rpb": 64, "unroll": 1}))
    )
    narrow = ell.model_copy(update={"sizes": {**ell.sizes, "width": 8}})
    assert "lanes with no slot" in str(
        template.problem(narrow, typed(template, narrow, {"tpr": 16, "rpb": 4, "unroll": 1, "pad": "stop"}))
    )
    assert template.valid(narrow, {"tpr": 4, "rpb": 8, "unroll": 8, "pad": "skip"}) == typed(template, narrow, {
        "tpr": 4, "rpb": 8, "unroll": 2, "pad": "skip"
    }), "two slots a lane: unrolling past them is the same kernel"  # fmt: skip
    widened = [t.model_copy(update={"dtype": "int64"}) if t.name == "row_ptr" else t for t in csr.inputs]
    wide = csr.model_copy(update={"inputs": widened})
    assert "int32 index arrays" in str(template.unsupported(wide))


def test_the_template_seeds_pass_the_source_guard_and_some_build_with_nvcc(tmp_path: Path, cubin_cache: Path) -> None:
    """Every seed of the three cards the template serves (bf16: the 16-bit paths and the widest vectors) passes the
    source guard and resolves against its card; the first and last of each, and ELL's `skip`, build for sm_90 with
    the plan's arguments (the others differ from them only in constants)."""
    builder = Builder(arch="sm_90", flags=("-O3",), cache_dir=cubin_cache, work_dir=tmp_path)
    built = []
    for name in ("spmv_csr", "spmv_ell", "spmm_csr"):
        spec = card(name, "bfloat16")
        seeds = TemplateProposer().seeds(spec)
        assert len(seeds) >= 3
        for p in seeds:
            launch = resolve(p.plan, spec)
            assert not [e for e in check_source(p.source, p.plan.entry, args=launch.args) if e.severity == "error"]
            assert 32 <= launch.threads_per_block <= 1024 and launch.threads_per_block % 32 == 0
        skip = [p for p in seeds if p.params.get("pad") == "skip"]
        built += [(p, resolve(p.plan, spec).args) for p in {id(p): p for p in [seeds[0], seeds[-1], *skip]}.values()]
    assert {p.params.get("pad") for p, _ in built} == {None, "skip", "stop"}

    async def build_all() -> list[str]:
        results = await asyncio.gather(*(builder.build(p.source, p.plan.entry, args) for p, args in built))
        return [f"{p.params}: {r.log[-1500:]}" for (p, _), r in zip(built, results, strict=True) if not r.ok]

    assert asyncio.run(build_all()) == []
