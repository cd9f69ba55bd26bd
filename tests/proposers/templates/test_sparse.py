"""CSR SpMV in the sparse template: the adopt strategy (the launch's later half hands its long rows to the earlier
half), paired (the heavier of each pair of row blocks first), the balanced strategy (a cluster's entries shared
evenly by its blocks), the stream strategy (a block's entries shared evenly by its threads) and the lane group per
row, all with vector loads and streaming hints.

Their rules and canonical forms, the levers, the seeds (the adopt strategy with 16-byte loads first, on the
suite's cards and at 2^26 entries), nvcc builds of every seed without spills, and the kernels' logic on the CPU: the
emulator (tests/support/cuda_emulator.py) runs a launch with every CUDA thread a fiber (__syncthreads and warp shuffles
are barriers, so a missing barrier, a divergent shuffle or a share summed twice shows; a cluster's blocks run together,
each with its own shared memory, so a missing cluster.sync() or a row written twice or never shows), and its outputs
must agree with the float64 reference on the suite's input sets (power-law, uniform, banded) and on the cases that break
SpMV kernels: empty rows and whole empty blocks, a row over many tiles, NaN and inf beside finite rows, a row over every
block of a cluster, empty rows at the cluster's block boundaries, clusters with fewer entries than blocks, long rows
crowded into one block (more than it hands over), adjacent, and last. The GPU test runs every seed through the evaluator
(every seeded and fresh set) on the suite's 2^22 card.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.config import Settings
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.proposers.templates.sparse import TILED, SparseTemplate, csr_shared_bytes
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Arrays, Precision
from kernelforge_tui.suite.tasks import sparse
from tests.conftest import canonical, typed
from tests.support.cuda_emulator import build, emulation_source, kernel_namespace

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16")
EMULATED_SCALE = 2**14
"""1024 rows: blocks of 32 to 1024 rows, power-law rows up to 512 entries."""
TEMPLATE = SparseTemplate()


def card(precision: Precision, scale: int = EMULATED_SCALE) -> OperatorCard:
    return cards.spec(task("spmv_csr"), precision, scale)


def card_of_entries(precision: Precision, nnz: int) -> OperatorCard:
    """The suite's card with nnz entries (16 a row): 2^26 is past the suite's scales; the template needs sizes only."""
    spec = card(precision, 2**22)
    return spec.model_copy(update={"sizes": sparse.CSR.sizes(nnz), "name": f"spmv_csr_{precision}_{nnz}"})


def stream(**changes: int | str) -> Params:
    params: Params = {"strategy": "stream", "tpr": 1, "rpb": 256, "unroll": 1, "block": 256, "items": 16}
    return {**params, "vec": 4, "hint": "stream", "minb": 4, "cluster": 2, "long": 256, **changes}


def vector(**changes: int | str) -> Params:
    params: Params = {"strategy": "vector", "tpr": 4, "rpb": 64, "unroll": 2, "block": 128, "items": 4}
    return {**params, "vec": 4, "hint": "stream", "minb": 4, "cluster": 2, "long": 256, **changes}


def balanced(**changes: int | str) -> Params:
    params: Params = {"strategy": "balanced", "tpr": 1, "rpb": 128, "unroll": 1, "block": 1024, "items": 8}
    return {**params, "vec": 4, "hint": "stream", "minb": 2, "cluster": 8, "long": 256, **changes}


def adopt(**changes: int | str) -> Params:
    params: Params = {"strategy": "adopt", "tpr": 1, "rpb": 512, "unroll": 1, "block": 512, "items": 8}
    return {**params, "vec": 4, "hint": "stream", "minb": 4, "cluster": 2, "long": 4096, **changes}


def test_the_rules_of_the_balanced_strategy() -> None:
    """Its shared memory holds the row pointers and sums of the cluster's cluster * rpb rows (a block's range may
    span any of them) beside a tile; it uses stream's parameters and `cluster`, which only it uses."""
    csr = card("float32")
    assert TEMPLATE.problem(csr, typed(TEMPLATE, csr, balanced())) is None
    assert csr_shared_bytes(typed(TEMPLATE, csr, balanced())) == 4 * (1025 + 1024 + 8192 + 255) == 41984
    assert csr_shared_bytes(typed(TEMPLATE, csr, balanced(cluster=4))) == 4 * (513 + 512 + 8192 + 255)
    assert "shared memory" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, balanced(rpb=256))))  # 2048 rows: 50 KB
    assert TEMPLATE.problem(csr, typed(TEMPLATE, csr, balanced(rpb=256, cluster=4))) is None
    assert csr_shared_bytes(typed(TEMPLATE, csr, stream(rpb=256, block=1024, items=8, cluster=8))) == 4 * (
        257 + 256 + 8192 + 255
    )
    assert "whole number of vec" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, balanced(vec=8, items=4))))
    assert "exceeds 2048" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, balanced(minb=4))))
    # tpr and unroll fixed; cluster kept for balanced, fixed at its first value for the others.
    assert canonical(TEMPLATE, csr, balanced(tpr=8, unroll=4)) == balanced()
    assert canonical(TEMPLATE, csr, balanced(cluster=4)) == balanced(cluster=4) != balanced()
    assert canonical(TEMPLATE, csr, stream(cluster=8)) == stream()
    assert canonical(TEMPLATE, csr, vector(cluster=4)) == vector()
    assert canonical(TEMPLATE, csr, balanced(cluster=16)) is None, "portable cluster sizes only"
    grids = {
        c: resolve(TEMPLATE.render(csr, typed(TEMPLATE, csr, balanced(rpb=32, cluster=c)))[1], csr).grid[0]
        for c in (2, 4, 8)
    }
    assert grids == {2: 16 * 2, 4: 8 * 4, 8: 4 * 8}, "cdiv(1024 rows, cluster * 32) clusters of `cluster` blocks"
    source = TEMPLATE.render(csr, typed(TEMPLATE, csr, balanced(cluster=4)))[0]
    assert "__cluster_dims__(4, 1, 1) __global__" in source and "cluster 4" in source
    assert "cluster" not in TEMPLATE.render(csr, typed(TEMPLATE, csr, stream()))[0], (
        "the stream kernel's source predates clusters"
    )


def test_the_rules_of_the_adopt_and_paired_strategies() -> None:
    """adopt tests one row of each block a thread, so its rows per block are at most its threads; it keeps the
    handed and adopted rows beside stream's shared memory; `long` is its alone (fixed for the others, and named in
    its source only); paired is stream's kernel and parameters with the pair's row blocks chosen first."""
    csr = card("float32")
    assert TEMPLATE.problem(csr, typed(TEMPLATE, csr, adopt())) is None
    assert "rpb 1024 > block 512" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, adopt(rpb=1024))))
    assert TEMPLATE.problem(csr, typed(TEMPLATE, csr, stream(rpb=1024, block=512, items=8, minb=2))) is None, (
        "stream has no such rule"
    )
    tile = 512 * 8
    assert csr_shared_bytes(typed(TEMPLATE, csr, adopt())) == 4 * (
        513 + 512 + tile + (tile - 1) // 32 + 5 * 16 + 512 // 32
    )
    assert canonical(TEMPLATE, csr, adopt(tpr=8, unroll=4, cluster=8)) == adopt()
    assert canonical(TEMPLATE, csr, adopt(long=1024)) == adopt(long=1024) != adopt()
    assert (
        canonical(TEMPLATE, csr, stream(long=4096)) == stream()
        and canonical(TEMPLATE, csr, vector(long=4096)) == vector()
    )
    assert canonical(TEMPLATE, csr, balanced(long=4096)) == balanced()
    assert canonical(TEMPLATE, csr, adopt(long=300)) is None, "long outside the space"
    source, plan = TEMPLATE.render(csr, typed(TEMPLATE, csr, adopt()))
    assert "long 4096" in source and "#define LONG 4096" in source and plan.grid == ["cdiv(nrows, 512)"]
    assert "long 256" not in TEMPLATE.render(csr, typed(TEMPLATE, csr, stream()))[0], (
        "the stream kernel's source predates `long`"
    )
    paired = stream(strategy="paired")
    assert canonical(TEMPLATE, csr, {**paired, "cluster": 8, "long": 4096}) == paired
    paired_source = TEMPLATE.render(csr, typed(TEMPLATE, csr, paired))[0]
    assert "row_block = late_entries > early_entries" in paired_source
    assert (
        TEMPLATE.render(csr, typed(TEMPLATE, csr, paired))[1] == TEMPLATE.render(csr, typed(TEMPLATE, csr, stream()))[1]
    )


def test_the_rules_of_the_two_strategies() -> None:
    csr = card("float32")
    assert (
        TEMPLATE.problem(csr, typed(TEMPLATE, csr, stream())) is None
        and TEMPLATE.problem(csr, typed(TEMPLATE, csr, vector())) is None
    )
    odd = csr.model_copy(update={"sizes": {**csr.sizes, "nnz": 16380}})
    assert "does not divide nnz" in str(TEMPLATE.problem(odd, typed(TEMPLATE, odd, stream(vec=8, items=8))))
    assert TEMPLATE.problem(odd, typed(TEMPLATE, odd, stream(vec=4))) is None, "16380 = 4 x 4095"
    assert "whole number of vec" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, stream(vec=8, items=4))))
    assert csr_shared_bytes(typed(TEMPLATE, csr, stream(block=1024, items=8, rpb=1024))) <= 48 * 1024
    assert "shared memory" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, stream(block=1024, items=16))))
    assert "exceeds 2048" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, stream(block=1024, items=8, minb=4))))
    assert "exceeds 2048" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, vector(tpr=32, rpb=32, minb=4))))
    assert "32..1024" in str(TEMPLATE.problem(csr, typed(TEMPLATE, csr, vector(tpr=32, rpb=64, minb=1))))
    # The other strategy's parameters are fixed, so twins compare equal (and the search does not try them twice).
    assert canonical(TEMPLATE, csr, stream(tpr=8, unroll=4)) == stream()
    assert canonical(TEMPLATE, csr, vector(block=512, items=32)) == vector()


def test_the_levers_move_the_csr_parameters_that_address_each_bottleneck() -> None:
    csr = card("float32")
    bandwidth = [lever.param for lever in TEMPLATE.levers_of(csr, "memory_bandwidth")]
    latency = [lever.param for lever in TEMPLATE.levers_of(csr, "memory_latency")]
    assert bandwidth == ["vec", "hint"], "ELL's pad is not in CSR's space"
    assert latency[:4] == ["strategy", "unroll", "items", "cluster"] and {"minb", "tpr", "rpb", "block"} <= set(latency)
    ell = cards.spec(task("spmv_ell"), "float32", EMULATED_SCALE)
    assert [lever.param for lever in TEMPLATE.levers_of(ell, "memory_bandwidth")] == ["pad"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_seeds_start_with_the_adopt_strategy_and_16_byte_loads(precision: Precision) -> None:
    """A short search meets the kernel expected fastest first on every scale: the suite's and 2^26 entries. The
    adopt seeds (the fastest on the H200's 2^22-row card: blocks of 256 threads and 256 rows, tiles of 1024
    entries, rows over 4096 entries handed over), then the stream seeds, then one balanced seed (clusters of 2 of
    512 rows a block: the best balanced kernel there), then the lane groups'."""
    wide = {"float32": 4, "bfloat16": 8}[precision]
    specs = [card(precision, scale) for scale in task("spmv_csr").scales] + [card_of_entries(precision, 2**26)]
    for spec in specs:
        seeds = TemplateProposer().seeds(spec)
        assert seeds[0].params == adopt(vec=wide, block=256, items=max(4, wide), rpb=256), spec.name
        assert seeds[0].plan.grid == ["cdiv(nrows, 256)"] and seeds[0].plan.block == [256]
        assert seeds[1].params == adopt(vec=wide, items=wide, minb=2)
        assert seeds[2].params == stream(vec=wide)
        assert seeds[2].plan.grid == ["cdiv(nrows, 256)"] and seeds[2].plan.block == [256]
        full = {"float32": 4, "bfloat16": 2}[precision]  # bf16's items 8 is DIRECT: 32 registers do not fit it
        assert seeds[6].params == balanced(vec=wide, block=512, items=8, rpb=512, cluster=2, minb=full)
        assert seeds[6].plan.grid == ["cdiv(nrows, 1024) * 2"] and seeds[6].plan.block == [512]
        assert {"tpr": 4, "vec": 4, "strategy": "vector"}.items() <= seeds[7].params.items()
        strategies = [str(p.params["strategy"]) for p in seeds]
        assert strategies == ["adopt"] * 2 + ["stream"] * 4 + ["balanced"] + ["vector"] * 4
        for proposal in seeds:
            if proposal.params["strategy"] == "balanced":
                rows = int(proposal.params["cluster"]) * int(proposal.params["rpb"])
                want = -(-spec.sizes["nrows"] // rows) * int(proposal.params["cluster"])
                assert resolve(proposal.plan, spec).grid[0] == want, (spec.name, proposal.params)
            args = resolve(proposal.plan, spec).args
            errors = [e for e in check_source(proposal.source, proposal.plan.entry, args=args) if e.severity == "error"]
            assert not errors, (spec.name, proposal.params, errors)


def test_every_csr_seed_builds_for_the_suite_and_2_26_cards_without_spills(sm90_builder: Builder) -> None:
    """The seeds' sources depend on the dtype alone (rows per block follow the mean row, 16 at every scale), so the
    small, 2^22 and 2^26 cards share them; each builds without spills, a stream kernel with the static shared memory
    `stream_shared_bytes` budgets (balanced: the row pointers and sums of its cluster's rows)."""
    specs = [card(p, s) for p in PRECISIONS for s in (2**10, 2**22)] + [card_of_entries(p, 2**26) for p in PRECISIONS]
    built = {p.source: (p, resolve(p.plan, spec).args) for spec in specs for p in TemplateProposer().seeds(spec)}
    assert len(built) == sum(len(TemplateProposer().seeds(card(p))) for p in PRECISIONS)

    async def build_all() -> list[str]:
        results = await asyncio.gather(*(sm90_builder.build(p.source, p.plan.entry, a) for p, a in built.values()))
        problems = []
        for (proposal, _), result in zip(built.values(), results, strict=True):
            stats = result.ptxas.get(proposal.plan.entry)
            if not result.ok or stats is None:
                problems.append(f"{proposal.params}: {result.log[-1500:]}")
            elif stats.spill_store_bytes or stats.spill_load_bytes:
                problems.append(f"{proposal.params}: spills {stats}")
            elif proposal.params["strategy"] in TILED and stats.shared_bytes != csr_shared_bytes(
                typed(TEMPLATE, specs[0], proposal.params)
            ):
                problems.append(f"{proposal.params}: {stats.shared_bytes} bytes of shared memory")
        return problems

    assert asyncio.run(build_all()) == []


# -- the CPU emulator -----------------------------------------------------------------------------------------------

RUNNER = r"""
// The case in `dir` (values.bin, col_idx.bin, row_ptr.bin, x.bin) through the kernel; y.bin, poisoned with NaN
// before the launch, written there. A clustered kernel runs again with its blocks in the other order: y must come
// out the same to the bit (a block's sums do not depend on when the others run), else a row was written twice.
void run(unsigned grid, unsigned block, int nrows, const std::string& dir) {
    const T* values = aligned<T>(slurp(dir + "/values.bin"));
    const int* col_idx = aligned<int>(slurp(dir + "/col_idx.bin"));
    const int* row_ptr = aligned<int>(slurp(dir + "/row_ptr.bin"));
    const T* x = aligned<T>(slurp(dir + "/x.bin"));
    T* y = aligned<T>(std::vector<char>(sizeof(T) * nrows));
    emu::launch_in_both_orders(
        grid, block, [&] { kf_spmv_csr(values, col_idx, row_ptr, x, y, nrows); }, emu_cluster_blocks, y,
        sizeof(T) * nrows, dir, [&] { for (int r = 0; r < nrows; ++r) y[r] = from_f(NAN); });
    std::ofstream(dir + "/y.bin", std::ios::binary).write(reinterpret_cast<const char*>(y), sizeof(T) * nrows);
}
"""
ARGUMENTS = ("unsigned", "unsigned", "int")
"""The runner's grid, block and nrows: the program's argv[2..4]."""


DIVERGENT = """typedef float T;
__device__ __forceinline__ T from_f(float v) { return v; }
// Half the warp shuffles: on a GPU undefined, in the emulator a deadlock it must report.
extern "C" __global__ void kf_spmv_csr(const T* values, const int* col_idx, const int* row_ptr, const T* x, T* y,
                                       int nrows) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    float sum = 0.0f;
    if (threadIdx.x % 2 == 0) {
        sum = __shfl_xor_sync(0xffffffffu, sum, 1);
    }
    if (r < nrows) {
        y[r] = from_f(sum);
    }
}
"""


def variants(precision: Precision) -> list[Params]:
    """Every seed in fp32; in bf16 (the same code but for the element's words and conversions) the first of each
    strategy. Then past the seeds: balanced with scalar loads in tiles of 512 and clusters of 8 blocks of 32 rows
    (a 10000-entry row spans most of its cluster's blocks), with 32-byte loads and clusters of 2 blocks of 16 rows,
    and one cluster of 2 blocks of 1024 rows (more than the card's: the last cluster short); stream with scalar loads
    in tiles of 512 (a power-law block spans several), one block owning every row, 32-byte loads (two 16-byte words
    in fp32), lane groups of 16 with plain loads, 1024-thread blocks; stream and balanced with a thread summing the
    chunk it loads (DIRECT: no barrier inside the loop, one after it)."""
    seeds = [p.params for p in TemplateProposer().seeds(card(precision))]
    if precision == "bfloat16":
        seeds = [next(p for p in seeds if p["strategy"] == strategy) for strategy in ("balanced", "stream", "vector")]
    return [
        *seeds,
        balanced(vec=1, items=4, block=128, rpb=32, cluster=8, hint="plain", minb=1),
        balanced(vec=8, items=32, block=128, rpb=16, cluster=2, minb=1),
        balanced(vec=2, items=4, block=1024, rpb=1024, cluster=2, minb=1),
        adopt(vec=1, items=4, block=128, rpb=32, long=256, hint="plain", minb=1),
        stream(strategy="paired", vec=1, items=4, block=128, rpb=32, hint="plain", minb=1),
        stream(strategy="paired", vec=4, items=8, block=256, rpb=64, minb=1),
        stream(strategy="paired", vec=8, items=8, block=1024, rpb=1024, minb=1),
        adopt(vec=4, items=16, block=256, rpb=128, long=1024, minb=1),
        adopt(vec=8, items=8, block=1024, rpb=1024, long=256, minb=1),
        adopt(vec=2, items=8, block=256, rpb=64, long=256, minb=1),
        stream(vec=1, items=4, block=128, rpb=32, hint="plain", minb=1),
        stream(vec=4, items=4, block=256, rpb=64, minb=1),
        balanced(vec=4, items=4, block=256, rpb=64, cluster=4, minb=1),
        stream(vec=2, items=8, block=1024, rpb=1024, minb=1),
        stream(vec=8, items=32, block=128, rpb=32, minb=1),
        vector(tpr=16, rpb=2, unroll=8, vec=8, hint="plain", minb=1),
        vector(tpr=2, rpb=512, unroll=4, vec=1, minb=1),
    ]


def suite_sets(precision: Precision) -> dict[str, Arrays]:
    """The seeded sets (power-law) and a fresh set of each other pattern, drawn by the task's own generator."""
    spmv = task("spmv_csr")
    assert spmv.generate is not None
    sizes = spmv.sizes(EMULATED_SCALE)
    fresh = {sparse.pattern_of(np.random.default_rng(s)): s for s in range(3, 40)}
    seeds = {"seed_1": 1, "seed_2": 2, **{f"fresh_{k}": s for k, s in fresh.items() if k != "power_law"}}
    return {name: spmv.generate(np.random.default_rng(seed), sizes, precision) for name, seed in seeds.items()}


def csr(lengths: np.ndarray, rng: np.random.Generator, precision: Precision) -> Arrays:
    """A matrix of the given row lengths, columns random, values and x uniform in [-1, 1]."""
    nnz = int(lengths.sum())
    assert nnz % 8 == 0, "every vec divides nnz"
    dtype = NUMPY[precision]
    return {
        "values": rng.uniform(-1, 1, nnz).astype(dtype),
        "col_idx": rng.integers(0, lengths.size, nnz).astype(np.int32),
        "row_ptr": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        "x": rng.uniform(-1, 1, lengths.size).astype(dtype),
    }


def hard_sets(precision: Precision, nrows: int) -> dict[str, Arrays]:
    """Empty leading, trailing and whole blocks of rows around a row of 10000 entries (tiles of 512 to 8192), and
    NaN and inf entries and x beside finite rows (a chunk that straddles two rows must not leak them). For the
    balanced strategy's clusters (of 32 to 2048 rows, split in 2 to 8 blocks by entries): a first row of 20000
    entries over every block of its cluster, then clusters of 1 to 3 entries or none (fewer than their blocks); and
    a row of 64 entries every 4 rows (the first of every 4 empty), so every block boundary of a cluster has 3 empty
    rows starting at it (which the later block writes), and the matrix ends with 2 empty rows at its end (the last
    block's)."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 40, nrows)
    lengths[:100] = 0
    lengths[-124:] = 0
    lengths[400:700] = 0
    lengths[300] = 10000
    lengths[301] += (-lengths.sum()) % 8
    long_row = csr(lengths, rng, precision)

    lengths = rng.integers(1, 33, nrows)
    lengths[-1] += (-lengths.sum()) % 8
    specials = csr(lengths, rng, precision)
    starts = specials["row_ptr"]
    values = specials["values"]
    values[starts[10]] = np.nan
    values[starts[20] + 1] = np.inf
    values[starts[30]], values[starts[30] + 1] = np.inf, -np.inf
    values[starts[40] : starts[41]] = -np.inf
    specials["x"][specials["col_idx"][starts[50]]] = np.inf

    lone = np.zeros(nrows, np.int64)
    lone[-1] = 40

    lengths = rng.integers(0, 4, nrows)
    lengths[0] = 20000
    lengths[nrows // 2 :] = 0
    lengths[600], lengths[800] = 3, 1
    lengths[1] += (-lengths.sum()) % 8
    spanning = csr(lengths, rng, precision)

    lengths = np.where(np.arange(nrows) % 4 == 1, 64, 0)
    boundaries = csr(lengths, rng, precision)
    lengths = rng.integers(0, 9, nrows)
    lengths[:20] = 300
    lengths[40:42] = 2000
    lengths[-30:-1] = 300
    lengths[-1] = 5000
    lengths[-2] += (-lengths.sum()) % 8
    crowded = csr(lengths, rng, precision)
    return {
        "long_row_and_empty_blocks": long_row,
        "nan_inf": specials,
        "only_the_last_row": csr(lone, rng, precision),
        "a_row_over_every_block_then_clusters_of_few_entries": spanning,
        "empty_rows_at_block_boundaries": boundaries,
        "long_rows_crowded_adjacent_and_last": crowded,
    }


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[Precision, list[Params]]]]:
    """One program per precision running every variant (built once: g++ parses the headers once); the fp32 one
    runs DIVERGENT after them."""
    work = tmp_path_factory.mktemp("csr-emulator")
    chosen = {precision: variants(precision) for precision in PRECISIONS}
    programs = {}
    for precision, params in chosen.items():
        kernels = [TEMPLATE.render(card(precision), typed(TEMPLATE, card(precision), p))[0] for p in params] + [
            DIVERGENT
        ] * (precision == "float32")
        namespaces = [kernel_namespace(index, source, RUNNER) for index, source in enumerate(kernels)]
        programs[precision] = emulation_source(namespaces, ARGUMENTS)
    build(work, programs)
    yield work, chosen


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_variant_agrees_with_the_reference_on_the_suite_and_the_hard_sets_in_emulation(
    emulator: tuple[Path, dict[Precision, list[Params]]], precision: Precision
) -> None:
    work, chosen = emulator
    spec = card(precision)
    spmv = task("spmv_csr")
    nrows = spec.sizes["nrows"]
    sets = {**suite_sets(precision), **hard_sets(precision, nrows)}
    directories = {}
    for name, inputs in sets.items():
        directory = work / f"{precision}-{name}"
        directory.mkdir(exist_ok=True)
        for tensor, array in inputs.items():
            (directory / f"{tensor}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
        directories[name] = directory
    tolerance = spmv.tolerance[precision]
    wrong = []
    for index, params in enumerate(chosen[precision]):
        launch = resolve(TEMPLATE.render(spec, typed(TEMPLATE, spec, params))[1], spec)
        command = [str(work / precision), str(index), str(launch.grid[0]), str(launch.threads_per_block), str(nrows)]
        ran = subprocess.run([*command, *map(str, directories.values())], capture_output=True, text=True)
        assert ran.returncode == 0, (params, ran.stderr)
        for name, directory in directories.items():
            y = np.frombuffer((directory / "y.bin").read_bytes(), NUMPY[precision])
            want = spmv.reference(sets[name], spec.sizes)["y"]
            off = np.count_nonzero(~tolerance.accepts(y, want))
            if off:
                wrong.append(f"{params} on {name}: {off} rows off")
    assert wrong == []


def test_the_emulator_reports_a_shuffle_that_half_the_warp_skips(
    emulator: tuple[Path, dict[Precision, list[Params]]],
) -> None:
    work, chosen = emulator
    case = work / "divergent"
    case.mkdir(exist_ok=True)
    for tensor, array in csr(np.full(64, 8), np.random.default_rng(0), "float32").items():
        (case / f"{tensor}.bin").write_bytes(array.tobytes())
    command = [str(work / "float32"), str(len(chosen["float32"])), "2", "32", "64", str(case)]
    ran = subprocess.run(command, capture_output=True, text=True)
    assert ran.returncode == 3 and "deadlock" in ran.stderr, ran.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_csr_seed_passes_every_set_of_the_suites_largest_card_and_is_timed(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, precision: Precision
) -> None:
    """On the H200: the 2^22-entry card (2^18 rows, power-law seeded sets, three fresh sets of any pattern); the
    times are printed (`-s`) for comparing the strategies against the baseline and cuSPARSE."""
    written = cards.write(task("spmv_csr"), precision, 2**22, tmp_path)
    settings = Settings.model_validate({"eval": {"timeout_s": 30.0, "fresh_seeds": 3}})
    evaluator = Evaluator(written, Builder(arch="sm_90"), settings, require_gpu()[0])
    seeds = TemplateProposer().seeds(written)

    async def run() -> list[str]:
        await evaluator.start()
        try:
            failed = []
            for seed in seeds:
                evaluation = await evaluator.evaluate(seed.source, seed.plan)
                result = evaluation.result
                if not evaluation.ok or result is None or result.candidate is None:
                    failed.append(f"{seed.params}: {evaluation.failure}: {evaluation.reason}")
                    continue
                baseline = result.baseline.median_us if result.baseline else float("nan")
                print(f"{precision} {result.candidate.median_us:8.1f} us (baseline {baseline:.1f}) {seed.params}")
            return failed
        finally:
            await evaluator.close()

    assert loop.run_until_complete(run()) == []
