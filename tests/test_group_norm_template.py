"""Group norm kept on chip: the strategies that read x once (a cluster's blocks each keep a slice of the group in
registers or shared memory) render, pass the source check and build for sm_90 without spills on the H200's captured
card and on small ones, fit Hopper's shared memory, seed first, and cover every element of every group once."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.cards import OperatorCard, resolve
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.store import draw_inputs
from kernelforge_tui.cards.stress import draw, running
from kernelforge_tui.gpu.build import Builder
from kernelforge_tui.gpu.source_check import check_source
from kernelforge_tui.proposers.templates import TemplateProposer, group_norm
from kernelforge_tui.proposers.templates.common import ELEMENT_BYTES, Params
from kernelforge_tui.proposers.templates.group_norm import (
    CP_ASYNC,
    GPCS,
    ON_CHIP,
    SMS_PER_GPC,
    GroupNormTemplate,
    kept_bytes,
    kept_items,
)
from tests.test_templates import _card

from .cuda_emulator import build, emulation_source, kernel_namespace, launch_call

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
    return [p for p in found if p is not None]


def variants(card: OperatorCard) -> list[Params]:
    """What to build (nvcc takes one to four seconds each): on the captured card one per (strategy, split, welford)
    it allows; on a small card each strategy once, registers and smem one at split 1 and the other at split 8 (in
    turns, card by card), welford 1 and 0, pipelined at the other split of smem's; the widest vector and largest
    block of each."""
    turn = SMALL.index(card) % 2 if card in SMALL else 0
    wanted = {ON_CHIP[turn]: (1, 1), ON_CHIP[1 - turn]: (8, 0), "pipelined": (8 if turn else 1, turn)}
    chosen: dict[tuple[object, ...], Params] = {}
    for params in sorted(on_chip(card), key=lambda p: (int(p["vec"]), int(p["block"]))):
        if card is CAPTURED or (params["split"], params["welford"]) == wanted[str(params["strategy"])]:
            chosen[params["strategy"], params["split"], params["welford"]] = params
    return list(chosen.values())


@pytest.fixture(scope="module")
def cubin_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    return tmp_path_factory.mktemp("group-norm-cubins")


async def test_every_on_chip_variant_builds_for_sm90_without_spills(cubin_cache: Path) -> None:
    """The captured card keeps its 512 KB groups as 4 or 8 slices (split 1 and 2 do not fit); small cards, odd
    spans and the statistics outputs take split 1 and 8. ptxas must not spill (a spilled slice is read twice)."""
    builder = Builder(arch="sm_90", flags=("-O3",), cache_dir=cubin_cache)
    jobs = [(card, params) for card in CARDS[:-1] for params in variants(card)]  # the fp16 card: its model only
    # 128 KB slices fit shared memory but not 1024 threads' registers (64 values each beside the working set).
    captured = {(p["strategy"], p["split"]) for c, p in jobs if c is CAPTURED}
    assert captured == {("smem", 4), ("smem", 8), ("registers", 8), ("pipelined", 8)}  # two 128 KB slices: no
    renders = [TEMPLATE.render(card, params) for card, params in jobs]
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
        _, plan = TEMPLATE.render(card, params)
        shared = resolve(plan, card).shared_bytes
        if params["strategy"] in CP_ASYNC:
            assert shared == kept_bytes(card, params) <= HOPPER_SHARED_PER_BLOCK - 1024, params
        else:
            assert shared == 0, params


def test_slices_that_cannot_stay_on_chip_are_refused() -> None:
    base: Params = {"block": 1024, "vec": 8, "welford": 1}
    for strategy in ON_CHIP:
        assert TEMPLATE.problem(CAPTURED, {**base, "strategy": strategy, "split": 2}) is not None  # 256 KB a block
        assert TEMPLATE.problem(CAPTURED, {**base, "strategy": strategy, "split": 8}) is None
    odd = SMALL[2]  # 81-element planes: vec 1, 4-byte fp32 chunks; bf16's 2-byte chunks are no cp.async size
    assert TEMPLATE.problem(odd, {**base, "strategy": "smem", "split": 8, "vec": 1}) is None
    bf16_odd = group_norm_card("odd_bf16", "bfloat16", {**odd.sizes}, False)
    assert "cp.async" in str(TEMPLATE.problem(bf16_odd, {**base, "strategy": "smem", "split": 8, "vec": 1}))
    # 128 values a thread (block 256, split 8, vec 8) would need more than the 255 registers ptxas allows.
    assert "registers" in str(TEMPLATE.problem(CAPTURED, {**base, "strategy": "registers", "split": 8, "block": 128}))


def test_the_seeds_start_with_a_group_a_cluster_of_eight_and_end_with_the_persistent_clusters() -> None:
    """The order the H200 measured: smem (51% of the copy ceiling), registers, the rereads (50%), and last the
    pipelined persistent clusters (2.1x the best's time)."""
    seeds = TemplateProposer().seeds(CAPTURED)
    assert seeds[0].params == {"strategy": "smem", "block": 256, "vec": 8, "split": 8, "welford": 1}
    assert seeds[1].params["strategy"] == "registers"
    assert {s.params["strategy"] for s in seeds[2:-1]} >= {"reread"}  # what worked before stays in the search
    assert seeds[-1].params == {"strategy": "pipelined", "block": 256, "vec": 8, "split": 8, "welford": 0}
    pipelined = seeds[-1].source
    assert "__launch_bounds__(256, 1)" in pipelined  # two 64 KB slices: one block an SM
    assert resolve(seeds[-1].plan, CAPTURED).grid[0] == 16 * 8  # 2 clusters of 8 in each of the 8 GPCs
    assert resolve(seeds[-1].plan, CAPTURED).shared_bytes == 2 * 64 * 1024
    # The copies of the next group go out before this one's wait, into the other buffer.
    loop = pipelined[pipelined.index("for (; gid < total; gid += clusters, cur ^= 1)") :]
    assert loop.index("load_slice(kept_buf + (cur ^ 1) * SLICE") < loop.index("__pipeline_wait_prior(1)")
    assert loop.index("__pipeline_wait_prior(1)") < loop.index("widen(kept[r], f)")
    first = seeds[0].source
    assert "__cluster_dims__(8, 1, 1)" in first and "__pipeline_memcpy_async" in first
    assert "__launch_bounds__(256, 3)" in first  # three 64 KB slices an SM
    assert "fmaf(f[j] - mean, g, b)" in first  # the form that keeps a constant group's beta exact
    assert "f[j] - pivot" in first


def owners(card: OperatorCard, params: Params, items: int) -> np.ndarray:
    """For every chunk of one group, how many (block rank, thread, k) of the kernel's loops keep it: block r of the
    cluster keeps chunks [nchunk * r / split, nchunk * (r + 1) / split), thread t its chunks t + k * block."""
    split, block, vec = int(params["split"]), int(params["block"]), int(params["vec"])
    nchunk = card.sizes["c"] // card.sizes["groups"] * card.sizes["h"] * card.sizes["w"] // vec
    counts = np.zeros(nchunk, dtype=np.int64)
    offsets = (np.arange(block)[:, None] + np.arange(items)[None, :] * block).ravel()
    for rank in range(split):
        lo, hi = nchunk * rank // split, nchunk * (rank + 1) // split
        kept = offsets[offsets < hi - lo]
        counts += np.bincount(lo + kept, minlength=nchunk)
    return counts


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.name)
def test_every_element_of_a_group_is_kept_and_written_by_exactly_one_thread(card: OperatorCard) -> None:
    """The NumPy model of the loops the source has (checked below), with ITEMS as the template renders it; one
    item fewer would leave chunks uncovered. A chunk never straddles two channels (vec divides h*w)."""
    hw = card.sizes["h"] * card.sizes["w"]
    for params in on_chip(card):
        source, _ = TEMPLATE.render(card, params)
        items = kept_items(card, params)
        assert f"#define ITEMS {items}\n" in source and f"#define HW {hw}\n" in source
        assert "const long long lo = nchunk * rank / SPLIT;" in source
        assert (
            source.count("const int r = threadIdx.x + k * BLOCK;\n if (r < kept_chunks)") == 4
        )  # keep, 2 statistics passes, normalise
        assert np.array_equal(owners(card, params, items), np.ones_like(owners(card, params, items))), params
        if items > 1:
            assert owners(card, params, items - 1).min() == 0
        assert hw % int(params["vec"]) == 0
        assert ELEMENT_BYTES[card.outputs[0].dtype] * int(params["vec"]) <= 16


# -- the CPU emulator (tests/cuda_emulator.py): the kernels' logic on every set, without clusters (split 1) ----------

RUNNER = """
void run(const std::string& dir) {{
    const T* x = aligned<T>(slurp(dir + "/x.bin"));
    const T* gamma = aligned<T>(slurp(dir + "/gamma.bin"));
    const T* beta = aligned<T>(slurp(dir + "/beta.bin"));
    T* y = aligned<T>(std::vector<char>(sizeof(T) * {elements}));
    T* mean = aligned<T>(std::vector<char>(sizeof(T) * {groups}));
    T* rstd = aligned<T>(std::vector<char>(sizeof(T) * {groups}));
    emu::launch({grid}, {block}, [&] {{ {call}; }});
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


def emulated_variants(card: OperatorCard) -> list[Params]:
    """Both shared memory strategies, both statistics, at the widest vector the card allows, split 1."""
    chosen = []
    for strategy, welford in itertools.product(CP_ASYNC, (0, 1)):
        widths = sorted(TEMPLATE.space(card)["vec"], key=int, reverse=True)
        params = ({"strategy": strategy, "block": 128, "vec": v, "split": 1, "welford": welford} for v in widths)
        chosen.append(next(p for p in params if TEMPLATE.problem(card, p) is None))
    return chosen


def emulated_namespace(index: int, card: OperatorCard, params: Params) -> str:
    """The variant with its runner (its launch fixed at compile time)."""
    source, plan = TEMPLATE.render(card, params)
    launch = resolve(plan, card)
    sizes = card.sizes
    elements, groups = sizes["n"] * sizes["c"] * sizes["h"] * sizes["w"], sizes["n"] * sizes["groups"]
    runner = RUNNER.format(elements=elements, groups=groups, grid=launch.grid[0], block=launch.threads_per_block,
                           call=launch_call(plan.entry, launch))  # fmt: skip
    return kernel_namespace(index, source, runner, launch.shared_bytes)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[tuple[OperatorCard, Params]]]]:
    work = tmp_path_factory.mktemp("group-norm-emulator")
    chosen = {c.name: [(c, p) for p in emulated_variants(c)] for c in EMULATED}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(group_norm, "persistent_clusters", lambda card, params: EMULATED_CLUSTERS)
        programs = {
            name: emulation_source([emulated_namespace(i, c, p) for i, (c, p) in enumerate(variants)], prelude=EXPF)
            for name, variants in chosen.items()
        }
        rendered = TEMPLATE.render(EMULATED[0], chosen[EMULATED[0].name][2][1])[1]
    assert resolve(rendered, EMULATED[0]).grid[0] == EMULATED_CLUSTERS  # the pipelined variant loops over groups
    build(work, programs)
    yield work, [v for variants in chosen.values() for v in variants]


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
