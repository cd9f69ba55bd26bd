"""Group norm kept on chip: the strategies that read x once (a cluster's blocks each keep a slice of the group in
registers or shared memory) render, pass the source check and build for sm_90 without spills on the H200's captured
card and on small ones, fit Hopper's shared memory, seed first, and cover every element of every group once."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.build.source_check import check_source
from kernelforge_tui.cards import OperatorCard, resolve
from kernelforge_tui.cards.directory import draw_inputs
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.stress import draw, running
from kernelforge_tui.proposers.templates import TemplateProposer, group_norm
from kernelforge_tui.proposers.templates.common import ELEMENT_BYTES, Params
from kernelforge_tui.proposers.templates.group_norm import (
    BLOCK_OVERHEAD,
    CP_ASYNC,
    GPCS,
    MOMENTS,
    ON_CHIP,
    SHARED,
    SHARED_PER_SM,
    SMS_PER_GPC,
    GroupNormTemplate,
    has_tail,
    kept_bytes,
    kept_items,
    on_chip_chunks,
)
from tests.conftest import typed
from tests.proposers.templates.test_templates import _card
from tests.support.cuda_emulator import build, emulation_source, kernel_namespace, launch_call

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

NCHW = ["n", "c", "h", "w"]
HOPPER_SHARED_PER_BLOCK = 227 * 1024
TEMPLATE = GroupNormTemplate()


def group_norm_card(name: str, dtype: str, sizes: dict[str, int], stats: bool) -> OperatorCard:
    outputs = [("y", dtype, NCHW)] + [(k, dtype, ["n", "groups"]) for k in ("mean", "rstd")] * stats
    inputs = [("x", dtype, NCHW), ("gamma", dtype, ["c"]), ("beta", dtype, ["c"])]
    return _card(name, "group_norm", sizes, inputs, outputs)


CAPTURED = group_norm_card("group_norm_bf16_8x512x128x128", "bfloat16",
                           {"n": 8, "c": 512, "h": 128, "w": 128, "groups": 32}, stats=False)  # fmt: skip
SMALL = [
    group_norm_card("diffusion_bf16_2x64x8x8", "bfloat16", {"n": 2, "c": 64, "h": 8, "w": 8, "groups": 32}, False),
    group_norm_card("diffusion_stats_bf16", "bfloat16", {"n": 2, "c": 64, "h": 8, "w": 8, "groups": 32}, True),
    group_norm_card("odd_stats_f32_2x64x9x9", "float32", {"n": 2, "c": 64, "h": 9, "w": 9, "groups": 8}, True),
    group_norm_card("stress_f16_2x64x32x32", "float16", {"n": 2, "c": 64, "h": 32, "w": 32, "groups": 32}, False),
]
CARDS = [CAPTURED, *SMALL]


def on_chip(card: OperatorCard) -> list[Params]:
    """Every valid configuration of the card that keeps x on chip."""
    space = {**TEMPLATE.space(card), "strategy": ON_CHIP}
    found = (TEMPLATE.valid(card, dict(zip(space, v, strict=True))) for v in itertools.product(*space.values()))
    return [p.as_dict() for p in found if p is not None]


def variants(card: OperatorCard) -> list[Params]:
    """What to build (nvcc takes one to four seconds each): on the captured card one per (strategy, split, moments,
    minb) it allows, Welford's at minb 0 only; on a small card each strategy once, registers and smem one at split 1
    and the other at split 8 (in turns, card by card), with the moments in turns too, pipelined and bulk at the other
    split of smem's; the widest vector and largest block of each."""
    turn = SMALL.index(card) % 2 if card in SMALL else 0
    moments = ("welford", "shifted") if turn else ("shifted", "welford")
    wanted = {ON_CHIP[turn]: (1, moments[0]), ON_CHIP[1 - turn]: (8, moments[1])}
    wanted["pipelined"] = (8 if turn else 1, "centred")
    wanted["bulk"] = (8 if turn else 1, moments[1 - turn])
    chosen: dict[tuple[object, ...], Params] = {}
    for params in sorted(on_chip(card), key=lambda p: (int(p["vec"]), int(p["block"]))):
        if card is CAPTURED:
            wanted_here = params["moments"] != "welford" or params["minb"] == 0
        else:
            wanted_here = (params["split"], params["moments"]) == wanted[str(params["strategy"])]
        if wanted_here:
            chosen[params["strategy"], params["split"], params["moments"], params["minb"]] = params
    return list(chosen.values())


async def test_every_on_chip_variant_builds_for_sm90_without_spills(cubin_cache: Path) -> None:
    """The captured card keeps its 512 KB groups as 4 or 8 slices (split 1 and 2 do not fit); small cards, odd
    spans and the statistics outputs take split 1 and 8. ptxas must not spill (a spilled slice is read twice)."""
    builder = Builder(arch="sm_90", flags=("-O3",), cache_dir=cubin_cache)
    jobs = [(card, params) for card in CARDS[:-1] for params in variants(card)]  # the fp16 card: its model only
    # 128 KB slices fit shared memory but not 1024 threads' registers (64 values each beside the working set).
    captured = {(p["strategy"], p["split"]) for c, p in jobs if c is CAPTURED}
    assert captured == {("smem", 4), ("smem", 8), ("bulk", 4), ("bulk", 8), ("registers", 8), ("pipelined", 8)}
    renders = [TEMPLATE.render(card, typed(TEMPLATE, card, params)) for card, params in jobs]
    for (card, params), (source, plan) in zip(jobs, renders, strict=True):
        assert not [p for p in check_source(source, plan.entry) if p.severity == "error"], (card.name, params)
        groups = card.sizes["n"] * card.sizes["groups"]
        if params["strategy"] == "pipelined":  # persistent: as many clusters as every GPC holds at once, at most
            groups = min(groups, GPCS * (SMS_PER_GPC // int(params["split"])))
        assert resolve(plan, card).grid[0] == groups * int(params["split"])
    results = await asyncio.gather(*(builder.build(source, plan.entry) for source, plan in renders))
    for (card, params), (_, plan), result in zip(jobs, renders, results, strict=True):
        assert result.ok, (card.name, params, result.log[-2000:])
        stats = result.ptxas[plan.entry]
        assert stats.spill_store_bytes == 0, (card.name, params, stats)
        assert stats.shared_bytes + resolve(plan, card).shared_bytes <= HOPPER_SHARED_PER_BLOCK


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.name)
def test_the_kept_slice_fits_shared_memory_and_the_plan_asks_for_it(card: OperatorCard) -> None:
    configurations = on_chip(card)
    assert configurations
    for params in configurations:
        _, plan = TEMPLATE.render(card, typed(TEMPLATE, card, params))
        shared = resolve(plan, card).shared_bytes
        if params["strategy"] in SHARED:
            assert shared == kept_bytes(card, typed(TEMPLATE, card, params)) <= HOPPER_SHARED_PER_BLOCK - 1024, params
        else:
            assert shared == 0, params


def test_slices_that_cannot_stay_on_chip_are_refused() -> None:
    base: Params = {"block": 1024, "vec": 8, "moments": "welford", "minb": 0}
    for strategy in ON_CHIP:
        assert (
            TEMPLATE.problem(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "strategy": strategy, "split": 2}))
            is not None
        )  # 256 KB a block
        assert TEMPLATE.problem(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "strategy": strategy, "split": 8})) is None
    odd = SMALL[2]  # 81-element planes: vec 1, 4-byte fp32 chunks; bf16's 2-byte chunks are no cp.async size
    assert TEMPLATE.problem(odd, typed(TEMPLATE, odd, {**base, "strategy": "smem", "split": 8, "vec": 1})) is None
    bf16_odd = group_norm_card("odd_bf16", "bfloat16", {**odd.sizes}, False)
    assert "cp.async" in str(
        TEMPLATE.problem(bf16_odd, typed(TEMPLATE, bf16_odd, {**base, "strategy": "smem", "split": 8, "vec": 1}))
    )
    # 128 values a thread (block 256, split 8, vec 8) would need more than the 255 registers ptxas allows.
    assert "registers" in str(
        TEMPLATE.problem(
            CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "strategy": "registers", "split": 8, "block": 128})
        )
    )


WAIT_SMEM = ("__pipeline_commit();", "__pipeline_wait_prior(0);")


def test_the_seeds_start_with_a_group_a_cluster_of_eight_and_end_with_the_persistent_clusters() -> None:
    """The order the H200 measured: the shifted moments in bulk copies and by cp.async (a hand-written kernel of the
    kind: 79% of the copy ceiling), then the centred ones (bulk 65%, cp.async 64%), both again at 4 blocks an SM
    with part of each slice in memory, Welford's, registers, the rereads, and last the pipelined persistent clusters
    (2.4x the best's time)."""
    seeds = TemplateProposer().seeds(CAPTURED)
    base = {"strategy": "smem", "block": 256, "vec": 8, "split": 8}
    assert seeds[0].params == {**base, "strategy": "bulk", "moments": "shifted", "minb": 0}
    assert seeds[1].params == {**base, "moments": "shifted", "minb": 0}
    assert seeds[2].params == {**base, "strategy": "bulk", "moments": "centred", "minb": 0}
    assert seeds[3].params == {**base, "moments": "centred", "minb": 0}
    assert seeds[4].params == {**base, "strategy": "bulk", "moments": "centred", "minb": 4}
    assert seeds[5].params == {**base, "moments": "centred", "minb": 4}
    assert seeds[6].params == {**base, "moments": "welford", "minb": 0}
    assert seeds[7].params["strategy"] == "registers"
    assert {s.params["strategy"] for s in seeds[8:-1]} == {"reread"}  # what worked before stays in the search
    assert seeds[-1].params == {**base, "strategy": "pipelined", "moments": "centred", "minb": 0}
    pipelined = seeds[-1].source
    assert "__launch_bounds__(256, 1)" in pipelined  # two 64 KB slices: one block an SM
    assert resolve(seeds[-1].plan, CAPTURED).grid[0] == 16 * 8  # 2 clusters of 8 in each of the 8 GPCs
    assert resolve(seeds[-1].plan, CAPTURED).shared_bytes == 2 * 64 * 1024
    # The copies of the next group go out before this one's wait, into the other buffer.
    loop = pipelined[pipelined.index("for (; gid < total; gid += clusters, cur ^= 1)") :]
    assert loop.index("load_slice(kept_buf + (cur ^ 1) * SLICE") < loop.index("__pipeline_wait_prior(1)")
    assert loop.index("__pipeline_wait_prior(1)") < loop.index("chunks.pass<true>")
    first = seeds[3].source
    assert "__cluster_dims__(8, 1, 1)" in first and "__pipeline_memcpy_async" in first
    assert "__launch_bounds__(256, 3)" in first  # three 64 KB slices an SM
    assert "fmaf(f[j] - mean, g, b)" in first  # the form that keeps a constant group's beta exact
    assert "v - pivot" in first
    # One bulk copy a block, by one thread, landing on the block's mbarrier, which every thread waits on.
    bulk = seeds[2].source
    assert "cuda/barrier" not in bulk and "__launch_bounds__(256, 3)" in bulk
    keep = bulk[bulk.index("void keep(const VecT* __restrict__ xs) const {") :]
    assert keep.index("mbarrier_expect(copy_bar, bytes);") < keep.index("bulk_load(kept, xs, bytes, copy_bar);")
    assert "mbarrier_wait(copy_bar, 0);" in bulk[bulk.index("void wait() const {") :]
    init = bulk.index("mbarrier_init(&copy_bar, 1);")
    copy = bulk.index("chunks.keep(xs);")
    assert init < bulk.index("__syncthreads();", init) < copy < bulk.index("chunks.wait();") < bulk.index("chunks.pass")
    # 4 blocks an SM: 3520 of the 4096 chunks (55 KB) in shared memory, the rest loaded while the copies fly: the
    # first pass loads the tail, then waits for the copies, then reads the kept chunks.
    for hybrid, (issued, wait) in zip(
        (seeds[4], seeds[5]), (("bulk_load(kept", "mbarrier_wait(copy_bar, 0);"), WAIT_SMEM), strict=True
    ):
        source = hybrid.source
        assert "__launch_bounds__(256, 4)" in source and "#define KEPT 3520" in source
        assert resolve(hybrid.plan, CAPTURED).shared_bytes == 3520 * 16
        assert issued in source[source.index("void keep(") :] and wait in source[source.index("void wait(") :]
        first_pass = source[source.index("void pass(Body body) const {") :]
        tail = first_pass.index("if constexpr (FIRST) {\n            rest(body);\n            wait();\n        }")
        assert tail < first_pass.index("widen(kept[r], f)")
        assert "for (int r = KEPT + threadIdx.x; r < kept_chunks; r += BLOCK)" in source
        assert source.index("chunks.keep(xs);") < source.index("chunks.pass<true>") and "chunks.wait();" not in source


def test_the_shifted_moments_sum_a_16_bit_mean_outputs_plain_values_once_a_chunk() -> None:
    """One pass, one reduction, and the centred pass only past SHIFT_LIMIT; a bf16 card's mean output takes its plain
    sum from each chunk's sum about the pivot (one fma a chunk), an fp32 card's adds every plain value (the chunk's
    failed stress:large in emulation), and both sum the plain values again in the centred pass."""
    params: Params = {"strategy": "bulk", "block": 256, "vec": 8, "split": 8, "moments": "shifted", "minb": 0}
    bf16_card = group_norm_card("stats_bf16", "bfloat16", {**CAPTURED.sizes}, True)
    bf16, _ = TEMPLATE.render(bf16_card, typed(TEMPLATE, bf16_card, params))
    assert bf16.count("chunks.pass<true>") == 1 and "#define SHIFT_LIMIT 16.0f" in bf16
    assert "raw += fmaf((float)VEC, pivot, cs);" in bf16 and "raw += v;" not in bf16
    assert "if (shift * shift > SHIFT_LIMIT * var) {" in bf16 and "centred += d * d;\n            plain += v;" in bf16
    fp32 = group_norm_card("stats_f32", "float32", {"n": 2, "c": 64, "h": 32, "w": 32, "groups": 32}, True)
    source, _ = TEMPLATE.render(fp32, typed(TEMPLATE, fp32, {**params, "strategy": "smem", "vec": 4}))
    assert "q += d * d;\n        raw += v;\n" in source and "fmaf((float)VEC, pivot, cs)" not in source


def test_a_clustered_reduction_pushes_its_parts_and_no_barrier_waits_for_them() -> None:
    """Each reduction of a clustered kernel has an exchange of its own, initialised by one thread before the block's
    relaxed cluster arrive; the cluster wait comes after the copies are issued and before the first reduction, which
    stores the block's result into every block's exchange and waits on its own: no cluster.sync(), no exit barrier.
    The persistent kernel, which reduces into the same parts group after group, pulls them between two barriers."""
    clustered: Params = {"strategy": "smem", "block": 256, "vec": 8, "split": 8, "moments": "centred", "minb": 0}
    for strategy, moments, reductions in (
        ("smem", "centred", 2),
        ("smem", "welford", 1),
        ("bulk", "shifted", 2),  # shifted: the second if needed
        ("registers", "welford", 1),
        ("reread", "centred", 2),
    ):
        params = {**clustered, "strategy": strategy, "moments": moments}
        if strategy == "registers":
            params["block"] = 1024
        source, _ = TEMPLATE.render(CAPTURED, typed(TEMPLATE, CAPTURED, params))
        reduce_all = source[source.index("__device__ __forceinline__ S reduce_all") :]
        reduce_all = reduce_all[: reduce_all.index("\n}\n")]
        assert "send_word(slot + k, words[k], &ex->bar, threadIdx.x);" in reduce_all, strategy
        assert reduce_all.index("send_word") < reduce_all.index("mbarrier_wait_cluster(&ex->bar, 0);")
        assert "cluster.sync" not in source and "barrier_arrive" not in source, strategy
        calls = [line for line in source.splitlines() if "reduce_all(" in line and "__device__" not in line]
        parts = [line.split("&")[-1].split(")")[0] for line in calls]
        assert len(parts) == reductions and len(set(parts)) == len(parts), parts  # no part reused
        arrive = source.index("__syncthreads();\ncluster_arrive_relaxed();")  # the block's, once initialised
        for part in parts:
            assert f"> {part};" in source and source.index(f"exchange_init(&{part});") < arrive, part
        join = source.index("cluster_wait();  // every block")
        assert arrive < join < source.index(calls[0])
        if strategy in ("smem", "bulk"):  # the slice's copies go out before the wait, so it costs nothing
            assert source.index("chunks.keep(xs);", arrive) < join
    pipelined, _ = TEMPLATE.render(CAPTURED, typed(TEMPLATE, CAPTURED, {**clustered, "strategy": "pipelined"}))
    reduce_all = pipelined[pipelined.index("__device__ __forceinline__ S reduce_all") :]
    assert reduce_all[: reduce_all.index("\n}\n")].count("cluster.sync();") == 2
    assert "send_word" not in pipelined and "Part<" not in pipelined
    single, _ = TEMPLATE.render(SMALL[0], typed(TEMPLATE, SMALL[0], {**clustered, "block": 128, "vec": 4, "split": 1}))
    assert "barrier" not in single.replace("__syncthreads", "") and "cluster" not in single


def test_minb_keeps_part_of_a_slice_and_matters_only_for_smem() -> None:
    """smem's minb sizes the kept chunks so that many blocks share an SM's shared memory; a value that leaves no
    tail, and every other strategy, is canonically 0; blocks an SM past the threads or the registers are refused."""
    base: Params = {"strategy": "smem", "block": 256, "vec": 8, "split": 8, "moments": "centred"}
    assert (
        kept_bytes(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "minb": 4})) == 3520 * 16
    )  # (228 KB / 4 - 2 KB) of the 64 KB slice
    assert kept_bytes(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "minb": 0})) == 64 * 1024
    assert TEMPLATE.valid(CAPTURED, {**base, "minb": 4}) == typed(TEMPLATE, CAPTURED, {**base, "minb": 4})
    registers = {**base, "strategy": "registers"}
    assert TEMPLATE.valid(CAPTURED, {**registers, "minb": 4}) == typed(TEMPLATE, CAPTURED, {**registers, "minb": 0})
    small = {**base, "block": 128, "vec": 4, "split": 1}
    # a 2 KB group: no tail
    assert TEMPLATE.valid(SMALL[0], {**small, "minb": 8}) == typed(TEMPLATE, SMALL[0], {**small, "minb": 0})
    assert "registers" in str(
        TEMPLATE.problem(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "minb": 6}))
    )  # 48 registers x 256 x 6 > 64K
    assert "exceeds 2048" in str(
        TEMPLATE.problem(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "block": 512, "minb": 6}))
    )
    assert (
        TEMPLATE.problem(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "block": 128, "minb": 6})) is None
    )  # 37 KB on chip, 27 KB a tail
    assert "less of a slice" in str(
        TEMPLATE.problem(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "block": 128, "minb": 8}))
    )  # 26.5 KB, 37.5
    assert "less of a slice" in str(
        TEMPLATE.problem(CAPTURED, typed(TEMPLATE, CAPTURED, {**base, "split": 4, "minb": 4}))
    )  # 55 of 128 KB


def owners(card: OperatorCard, params: Params, items: int) -> np.ndarray:
    """For every chunk of one group, how many (block rank, thread, k) of the kernel's loops keep it: block r of the
    cluster keeps chunks [nchunk * r / split, nchunk * (r + 1) / split), thread t its chunks t + k * block."""
    split, block, vec = int(params["split"]), int(params["block"]), int(params["vec"])
    nchunk = card.sizes["c"] // card.sizes["groups"] * card.sizes["h"] * card.sizes["w"] // vec
    counts = np.zeros(nchunk, dtype=np.int64)
    offsets = (np.arange(block)[:, None] + np.arange(items)[None, :] * block).ravel()
    on_chip = on_chip_chunks(card, typed(TEMPLATE, card, params))
    for rank in range(split):
        lo, hi = nchunk * rank // split, nchunk * (rank + 1) // split
        kept = offsets[offsets < min(hi - lo, on_chip)]
        counts += np.bincount(lo + kept, minlength=nchunk)
        tail = (on_chip + np.arange(block)[:, None] + np.arange(-(-(hi - lo) // block))[None, :] * block).ravel()
        counts += np.bincount(lo + tail[tail < hi - lo], minlength=nchunk)  # r = KEPT + t; r < hi - lo; r += block
    return counts


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.name)
def test_every_element_of_a_group_is_kept_and_written_by_exactly_one_thread(card: OperatorCard) -> None:
    """The NumPy model of the loops the source has (checked below), with ITEMS as the template renders it; one
    item fewer would leave chunks uncovered. A chunk never straddles two channels (vec divides h*w)."""
    hw = card.sizes["h"] * card.sizes["w"]
    for params in on_chip(card):
        source, _ = TEMPLATE.render(card, typed(TEMPLATE, card, params))
        items = kept_items(card, typed(TEMPLATE, card, params))
        assert f"#define ITEMS {items}\n" in source and f"#define HW {hw}\n" in source
        assert "const long long lo = nchunk * rank / SPLIT;" in source
        tail = has_tail(card, typed(TEMPLATE, card, params))
        assert f"const int on_chip = {'min(kept_chunks, KEPT)' if tail else 'kept_chunks'};" in source, params
        # The copies (bulk: one by one thread; pipelined: load_slice's, of the whole slice) and the passes' loop.
        loops = 1 + (params["strategy"] in ("registers", "smem"))
        assert source.count("const int r = threadIdx.x + k * BLOCK;\n            if (r < on_chip) {") == loops, params
        if params["strategy"] == "pipelined":
            assert source.count("const int r = threadIdx.x + k * BLOCK;\n if (r < kept_chunks)") == 1
        assert source.count("for (int r = KEPT + threadIdx.x; r < kept_chunks; r += BLOCK)") == tail
        assert source.count("chunks.pass<") == 3, params  # two statistics passes, or one and the centred, normalising
        assert np.array_equal(owners(card, params, items), np.ones_like(owners(card, params, items))), params
        if items > 1:
            assert owners(card, params, items - 1).min() == 0
        assert hw % int(params["vec"]) == 0
        assert ELEMENT_BYTES[card.outputs[0].dtype] * int(params["vec"]) <= 16


# -- the CPU emulator (tests/support/cuda_emulator.py): the kernels' logic on every set, alone and in clusters ---------

RUNNER = """
void run(const std::string& dir) {{
    const T* x = aligned<T>(slurp(dir + "/x.bin"));
    const T* gamma = aligned<T>(slurp(dir + "/gamma.bin"));
    const T* beta = aligned<T>(slurp(dir + "/beta.bin"));
    T* y = aligned<T>(std::vector<char>(sizeof(T) * {elements}));
    T* mean = aligned<T>(std::vector<char>(sizeof(T) * {groups}));
    T* rstd = aligned<T>(std::vector<char>(sizeof(T) * {groups}));
    // A clustered kernel runs again with its blocks in the other order: y must come out bit for bit the same.
    emu::launch_in_both_orders({grid}, {block}, [&] {{ {call}; }}, emu_cluster_blocks, y, sizeof(T) * {elements}, dir);
    std::ofstream(dir + "/y.bin", std::ios::binary).write(reinterpret_cast<const char*>(y), sizeof(T) * {elements});
    std::ofstream(dir + "/mean.bin", std::ios::binary).write(reinterpret_cast<const char*>(mean), sizeof(T) * {groups});
    std::ofstream(dir + "/rstd.bin", std::ios::binary).write(reinterpret_cast<const char*>(rstd), sizeof(T) * {groups});
}}
"""
EXPF = "inline float __expf(float v) { return std::exp(v); }\n"
NORM_TOLERANCE = {"float32": {"rtol": 1e-5, "atol": 1e-5}, "bfloat16": {"rtol": 1.6e-2, "atol": 1e-3}}
"""A centring norm's tolerance, as the suite's and the GPU test's cards give it (outputs near zero carry the mean's
rounding)."""


def norm_card(name: str, dtype: str, sizes: dict[str, int]) -> OperatorCard:
    """A group norm card with the statistics outputs, each output at a centring norm's tolerance."""
    data = group_norm_card(name, dtype, sizes, True).model_dump()
    for output in data["outputs"]:
        output["tolerance"] = NORM_TOLERANCE[dtype]
    return OperatorCard.model_validate(data)


EMULATED = [
    norm_card("emulated_bf16_5x12x4x6", "bfloat16", {"n": 5, "c": 12, "h": 4, "w": 6, "groups": 3}),
    norm_card("emulated_f32_4x8x5x5", "float32", {"n": 4, "c": 8, "h": 5, "w": 5, "groups": 4}),
    norm_card("emulated_f32_2x64x32x32", "float32", {"n": 2, "c": 64, "h": 32, "w": 32, "groups": 32}),
]
EMULATED_CLUSTERS = 2
"""The pipelined grid in emulation: two clusters, so each works through several groups, both buffers in turn (any
grid must be right; the H200's size is a matter of speed)."""


def shared_for_a_tail(card: OperatorCard, params: Params) -> int:
    """The shared memory an SM would need for minb blocks each to keep two thirds of its slice on chip (the rest its
    tail: the emulated cards' slices are too small to leave one on Hopper's)."""
    chunk_bytes = int(params["vec"]) * ELEMENT_BYTES[card.outputs[0].dtype]
    kept = (2 * group_norm.slice_chunks(card, typed(TEMPLATE, card, params)) + 2) // 3
    return int(params["minb"]) * (BLOCK_OVERHEAD + kept * chunk_bytes)


def emulated_variants(card: OperatorCard, patch: pytest.MonkeyPatch) -> list[tuple[Params, str]]:
    """Both shared memory strategies, both statistics, at the widest vector the card allows, split 1; then smem at
    4 blocks an SM, part of each slice read from memory (with `shared_for_a_tail`); then clusters of 2 and 4
    blocks a group (smem whole and with a tail, registers, reread), their blocks run together and in both orders;
    then bulk copies, alone and in a cluster, whole and with a tail, on the cards whose chunks are 16 bytes. Each
    variant is rendered as it is chosen, under the shared memory it was chosen with."""
    kinds = [*itertools.product(CP_ASYNC, MOMENTS, (0,), (1,)), ("smem", "centred", 4, 1), ("smem", "welford", 4, 1)]
    kinds += [("smem", "shifted", 4, 1), ("reread", "shifted", 0, 1)]
    kinds += [("smem", "centred", 0, 2), ("smem", "welford", 4, 4), ("smem", "shifted", 4, 2)]  # clusters
    kinds += [("registers", "welford", 0, 2), ("registers", "shifted", 0, 4), ("reread", "centred", 0, 4)]
    kinds += [("reread", "shifted", 0, 2)]
    bulk = [("bulk", "centred", 0, 1), ("bulk", "welford", 4, 1), ("bulk", "centred", 4, 2), ("bulk", "shifted", 0, 2)]
    widths = sorted(TEMPLATE.space(card)["vec"], key=int, reverse=True)
    chosen = []
    for strategy, moments, minb, split in kinds + bulk:
        found = None
        for vec in widths:
            params = {"strategy": strategy, "block": 128, "vec": vec, "split": split, "moments": moments, "minb": minb}
            patch.setattr(group_norm, "SHARED_PER_SM", shared_for_a_tail(card, params) if minb else SHARED_PER_SM)
            if TEMPLATE.valid(card, params) == typed(TEMPLATE, card, params):
                found = params
                break
        assert found is not None or strategy == "bulk", (card.name, strategy, minb, split)
        if found is not None:
            assert has_tail(card, typed(TEMPLATE, card, found)) == bool(minb), found
            chosen.append((found, emulated_namespace(len(chosen), card, found)))
    patch.setattr(group_norm, "SHARED_PER_SM", SHARED_PER_SM)
    return chosen


def emulated_namespace(index: int, card: OperatorCard, params: Params) -> str:
    """The variant with its runner (its launch fixed at compile time)."""
    source, plan = TEMPLATE.render(card, typed(TEMPLATE, card, params))
    launch = resolve(plan, card)
    sizes = card.sizes
    elements, groups = sizes["n"] * sizes["c"] * sizes["h"] * sizes["w"], sizes["n"] * sizes["groups"]
    runner = RUNNER.format(elements=elements, groups=groups, grid=launch.grid[0], block=launch.threads_per_block,
                           call=launch_call(plan.entry, launch))  # fmt: skip
    return kernel_namespace(index, source, runner, launch.shared_bytes)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[tuple[OperatorCard, Params]]]]:
    work = tmp_path_factory.mktemp("group-norm-emulator")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(group_norm, "persistent_clusters", lambda card, params: EMULATED_CLUSTERS)
        chosen = {c.name: (c, emulated_variants(c, patch)) for c in EMULATED}
        rendered = TEMPLATE.render(EMULATED[0], typed(TEMPLATE, EMULATED[0], chosen[EMULATED[0].name][1][3][0]))[1]
    assert resolve(rendered, EMULATED[0]).grid[0] == EMULATED_CLUSTERS  # the pipelined variant loops over groups
    programs = {
        name: emulation_source([n for _, n in variants], prelude=EXPF) for name, (_, variants) in chosen.items()
    }
    build(work, programs)
    yield work, [(card, p) for card, variants in chosen.values() for p, _ in variants]


def group_norm_float64(inputs: dict[str, np.ndarray], sizes: dict[str, int]) -> dict[str, np.ndarray]:
    x = inputs["x"].astype(np.float64)
    spans = x.reshape(sizes["n"], sizes["groups"], -1)
    mean = spans.mean(axis=-1)
    rstd = 1.0 / np.sqrt(((spans - mean[..., None]) ** 2).mean(axis=-1) + 1e-5)
    normed = ((spans - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    gamma, beta = (inputs[k].astype(np.float64)[:, None, None] for k in ("gamma", "beta"))
    return {"y": normed * gamma + beta, "mean": mean.ravel(), "rstd": rstd.ravel()}


@pytest.mark.parametrize("card", EMULATED, ids=lambda c: c.name)
def test_the_shared_memory_kernels_match_float64_on_every_set_in_emulation(
    emulator: tuple[Path, list[tuple[OperatorCard, Params]]], card: OperatorCard
) -> None:
    """The smem and pipelined kernels (both statistics) against a float64 group norm on the seeded, a fresh and
    every stress set of the family; the statistics outputs too, but not on nan-inf (a mean of inf is the
    implementation's own, as on the GPU test)."""
    work, variants = emulator
    base = draw_inputs(card, card.stress.seed)
    sets = {"seeded": draw_inputs(card, 1), "fresh": draw_inputs(card, 9001)}
    sets.update({f"stress-{p.name}": draw(card, p.name, base) for p in running(card)})
    assert {"stress-large", "stress-large-mean", "stress-equal-rows", "stress-nan-inf"} <= set(sets)
    for name, arrays in sets.items():
        (work / f"{card.name}-{name}").mkdir(exist_ok=True)
        for tensor, array in arrays.items():
            (work / f"{card.name}-{name}" / f"{tensor}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
    wrong = []
    directories = [work / f"{card.name}-{name}" for name in sets]
    for index, params in enumerate(p for c, p in variants if c.name == card.name):
        command = [str(work / card.name), str(index), *map(str, directories)]
        ran = subprocess.run(command, capture_output=True, text=True)
        assert ran.returncode == 0, (card.name, params, ran.stderr)
        for (name, arrays), directory in zip(sets.items(), directories, strict=True):
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                want = group_norm_float64(arrays, card.sizes)
            for output in card.outputs if name != "stress-nan-inf" else card.outputs[:1]:
                got = np.frombuffer((directory / f"{output.name}.bin").read_bytes(), NUMPY[output.dtype])
                expected = want[output.name].reshape(-1).astype(NUMPY[output.dtype])
                off = np.count_nonzero(~output.effective_tolerance().accepts(got, expected))
                if off:
                    wrong.append(f"{params} on {name}: {output.name} {off} of {got.size} off")
    assert wrong == []
