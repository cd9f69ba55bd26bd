"""Adaptive average pooling to 1x1 in the pooling template: the stream strategy (a block loads a run of planes with
coalesced vector loads into shared memory, lanes sum each plane from there) beside the direct one (lanes read a
plane in place).

Its rules and canonical forms, the levers, the seeds (stream first, 16-byte loads on the 256x2048x7x7 card), nvcc
builds on that card and on small shapes (7x7, 8x8, 1x1, 14x14, 5x3, odd channel counts, partial last runs), a NumPy
model of the work split evaluated from the very C expressions the kernel is rendered with (every element loaded
once, from an aligned chunk, and summed once into its own plane's mean, by lanes of one shuffle group), and the
kernels on the CPU (tests/support/cuda_emulator.py: every CUDA thread a fiber) against the float64 mean
on the seeded, fresh and every stress set of the pooling family.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards.directory import draw_inputs
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.cards.stress import draw, running
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.proposers.templates import pooling as template_module
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.proposers.templates.pooling import PoolingTemplate, stream_counts
from tests.conftest import canonical, typed
from tests.support.cuda_emulator import build, emulation_source, kernel_namespace, launch_call

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

TEMPLATE = PoolingTemplate()
SMALL_SHAPES = [(3, 37, 7, 7), (2, 5, 8, 8), (4, 9, 1, 1), (1, 6, 14, 14), (2, 3, 5, 3)]
"""(n, c, h, w): odd and even planes, one-element planes, odd channel counts (partial last runs)."""


def card(n: int, c: int, h: int, w: int, dtype: str = "bfloat16") -> OperatorCard:
    return OperatorCard.model_validate(
        {
            "name": f"avg_pool_{dtype}_{n}x{c}x{h}x{w}", "family": "pooling", "sizes": {"n": n, "c": c, "h": h, "w": w},
            "inputs": [{"name": "x", "dtype": dtype, "shape": ["n", "c", "h", "w"]}],
            "outputs": [{"name": "y", "dtype": dtype, "shape": ["n", "c", 1, 1]}],
            "input_sets": [{"name": "seed_1", "seed": 1}], "reference": {"function": "ref.py:avg_pool"},
            "stress": {"seed": 7},
        }
    )  # fmt: skip


BIG = card(256, 2048, 7, 7)


def stream(**changes: int | str) -> Params:
    params: Params = {"strategy": "stream", "tpr": 4, "block": 256, "vec": 8, "planes": 64, "minb": 8}
    return {**params, **changes}


def direct(**changes: int | str) -> Params:
    params: Params = {"strategy": "direct", "tpr": 8, "block": 256, "vec": 1, "planes": 1, "minb": 1}
    return {**params, **changes}


def test_the_rules_of_the_stream_strategy() -> None:
    assert TEMPLATE.problem(BIG, typed(TEMPLATE, BIG, stream())) is None
    assert "runs would not start on a vector" in str(
        TEMPLATE.problem(BIG, typed(TEMPLATE, BIG, stream(planes=4)))
    )  # 4 x 49 % 8
    assert TEMPLATE.problem(BIG, typed(TEMPLATE, BIG, stream(planes=4, vec=4))) is None
    assert "shared memory" in str(
        TEMPLATE.problem(card(1, 64, 56, 56), typed(TEMPLATE, card(1, 64, 56, 56), stream(planes=8, block=512, minb=4)))
    )
    assert "loads a thread" in str(
        TEMPLATE.problem(BIG, typed(TEMPLATE, BIG, stream(planes=256, block=64, vec=2, minb=1)))
    )
    assert "lanes with no element" in str(
        TEMPLATE.problem(card(4, 9, 1, 1), typed(TEMPLATE, card(4, 9, 1, 1), stream(tpr=2, planes=8)))
    )
    assert "exceeds 2048" in str(TEMPLATE.problem(BIG, typed(TEMPLATE, BIG, stream(minb=16))))
    assert "already holds" in str(
        TEMPLATE.problem(card(3, 5, 7, 7), typed(TEMPLATE, card(3, 5, 7, 7), stream(planes=32)))
    )
    assert TEMPLATE.problem(card(3, 5, 7, 7), typed(TEMPLATE, card(3, 5, 7, 7), stream(planes=16))) is None, (
        "a run past the 15 planes: one partial run"
    )
    # The direct strategy keeps its rules, and its unused parameters are fixed so twins compare equal.
    assert "does not divide h*w" in str(TEMPLATE.problem(BIG, typed(TEMPLATE, BIG, direct(vec=2))))
    assert canonical(TEMPLATE, BIG, direct(planes=64, minb=4)) == direct()
    assert canonical(TEMPLATE, BIG, stream()) == stream()


def test_the_levers_move_the_average_parameters_that_address_each_bottleneck() -> None:
    bandwidth = [lever.param for lever in TEMPLATE.levers_of(BIG, "memory_bandwidth")]
    latency = [lever.param for lever in TEMPLATE.levers_of(BIG, "memory_latency")]
    assert bandwidth == ["vec", "planes"]
    assert latency == ["strategy", "block", "planes", "minb", "tpr"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_seeds_start_with_the_stream_strategy_and_the_widest_aligned_load(dtype: str) -> None:
    seeds = TemplateProposer().seeds(card(256, 2048, 7, 7, dtype))
    first = {"bfloat16": stream(), "float32": stream(planes=32, vec=4, tpr=8)}[dtype]  # ~8 KB runs, lanes fill a block
    assert seeds[0].params == first
    assert seeds[0].plan.grid == [f"cdiv(n * c, {first['planes']})"] and seeds[0].plan.block == [256]
    assert {str(s.params["strategy"]) for s in seeds} == {"stream", "direct"}
    assert [s.params["strategy"] for s in seeds].index("direct") == 3, "the stream seeds come first"


def test_every_small_shape_seeds_a_valid_stream_kernel_first() -> None:
    for shape in SMALL_SHAPES:
        spec = card(*shape)
        seeds = TemplateProposer().seeds(spec)
        assert seeds[0].params["strategy"] == "stream", shape
        assert canonical(TEMPLATE, spec, seeds[0].params) == seeds[0].params, shape


# -- the work split, from the kernel's own expressions ---------------------------------------------------------------


def evaluate(expression: str, **names: object) -> np.ndarray:
    """A C integer expression of the kernel over NumPy arrays (its operands are non-negative: / is floor)."""
    python = expression.replace("threadIdx.x", "thread").replace("/", "//")
    return np.asarray(eval(python, {"__builtins__": {}}, names))


def work_split_problems(spec: OperatorCard, params: Params) -> list[str]:
    """What the stream kernel's indexing gets wrong on the card: elements loaded other than once or from a
    misaligned chunk, elements summed other than once or into another plane, means written other than once, a
    plane's lanes in more than one shuffle group."""
    hw, planes = spec.sizes["h"] * spec.sizes["w"], spec.sizes["n"] * spec.sizes["c"]
    run, block, vec, tpr = (int(params[k]) for k in ("planes", "block", "vec", "tpr"))
    counts = stream_counts(spec, typed(TEMPLATE, spec, params))
    c_names = {"BLOCK": block, "TPR": tpr}
    thread = np.arange(block)[:, None]
    chunk = evaluate(template_module.LOAD_CHUNK, u=np.arange(counts["LOADS"])[None, :], thread=thread, **c_names)
    chunk = chunk[chunk < counts["CHUNKS"]]
    slot = evaluate(template_module.SUM_SLOT, it=np.arange(counts["SUMS"])[None, :], thread=thread, **c_names)
    plane = evaluate(template_module.SLOT_PLANE, slot=slot, **c_names)
    lane = evaluate(template_module.SLOT_LANE, slot=slot, **c_names)
    step = evaluate(template_module.PLANE_ELEMENT, lane=lane[..., None], j=np.arange(counts["STEPS"]), **c_names)
    loaded = np.zeros(planes * hw, np.int64)
    summed = np.zeros(planes * hw, np.int64)
    written = np.zeros(planes, np.int64)
    problems = []
    firsts = np.arange(0, planes, run)
    whole = firsts[firsts + run <= planes][:, None]
    starts = whole * hw + chunk[None, :] * vec
    if np.any(starts % vec):
        problems.append(f"a chunk not on a multiple of {vec} elements")
    np.add.at(loaded, (starts[..., None] + np.arange(vec)).ravel(), 1)
    if planes % run:
        last = int(firsts[-1])
        tail = evaluate(template_module.TAIL_ELEMENT, k=np.arange(counts["TAIL_STEPS"])[None, :], thread=thread,
                        **c_names)  # fmt: skip
        np.add.at(loaded, last * hw + tail[tail < (planes - last) * hw], 1)
    first = firsts[:, None, None]
    valid = (plane < run) & (first + plane < planes)
    adds = valid[..., None] & (step < hw)
    if np.any(np.broadcast_to(plane[..., None] * hw + step, adds.shape)[adds] >= counts["CHUNKS"] * vec):
        problems.append("an element read past the run in shared memory")
    np.add.at(summed, ((first + plane)[..., None] * hw + step)[adds], 1)
    np.add.at(written, (first + plane)[valid & (lane == 0)], 1)
    # The lanes of a plane are one aligned group of TPR threads (group_reduce's shuffles).
    plane_of = plane.transpose()  # [step, thread]
    its, threads = np.nonzero(plane_of < run)
    pairs = np.unique(np.stack([its, plane_of[its, threads]]), axis=1).shape[1]
    if pairs != np.unique(np.stack([its, plane_of[its, threads], threads // tpr]), axis=1).shape[1]:
        problems.append("a plane's lanes in two shuffle groups")
    if np.any(loaded != 1):
        problems.append(f"{np.count_nonzero(loaded != 1)} elements loaded other than once")
    if np.any(summed != 1):
        problems.append(f"{np.count_nonzero(summed != 1)} elements summed other than once")
    if np.any(written != 1):
        problems.append(f"{np.count_nonzero(written != 1)} means written other than once")
    return problems


def stream_variants(spec: OperatorCard, minb: int = 1) -> list[Params]:
    """Every valid stream configuration of the card with one minb (minb changes no index)."""
    space = TEMPLATE.space(spec)
    found = []
    for tpr in space["tpr"]:
        for block in space["block"]:
            for vec in space["vec"]:
                for run in space["planes"]:
                    params = canonical(TEMPLATE, spec, stream(tpr=tpr, block=block, vec=vec, planes=run, minb=minb))
                    if params is not None:
                        found.append(params)
    return found


def test_the_work_split_loads_each_element_once_and_sums_each_plane_whole() -> None:
    checked = 0
    for shape in [*SMALL_SHAPES, (1, 203, 7, 7)]:
        spec = card(*shape)
        for params in stream_variants(spec)[::3]:  # a third of each shape's ~100-400: every parameter varies
            assert work_split_problems(spec, params) == [], (shape, params)
            checked += 1
    assert checked > 200


def test_the_work_split_model_sees_a_kernel_that_skips_the_last_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model is evaluated from the template's expressions: one that drops a chunk is caught."""
    spec, params = card(1, 203, 7, 7), stream()
    monkeypatch.setattr(template_module, "LOAD_CHUNK", "u * BLOCK + threadIdx.x + (u * BLOCK + threadIdx.x) / 391")
    assert "elements loaded other than once" in " ".join(work_split_problems(spec, params))
    monkeypatch.undo()
    monkeypatch.setattr(template_module, "PLANE_ELEMENT", "lane + j * TPR + 1")
    assert "elements summed other than once" in " ".join(work_split_problems(spec, params))


# -- nvcc -------------------------------------------------------------------------------------------------------------


def test_the_stream_kernels_build_for_the_big_card_and_small_shapes_without_spills(sm90_builder: Builder) -> None:
    """The builder checks each plan's arguments against the kernel's parameters; ptxas's shared memory is the
    run's bytes (the template's budget)."""
    cases = [(BIG, p.params) for p in TemplateProposer().seeds(BIG) if p.params["strategy"] == "stream"]
    cases += [(card(*shape), TemplateProposer().seeds(card(*shape))[0].params) for shape in SMALL_SHAPES]
    cases += [(card(2, 5, 8, 8), stream(vec=1, tpr=32, planes=8, block=64, minb=16))]
    cases += [(card(1, 203, 7, 7, "float32"), stream(vec=4, tpr=1, planes=128, block=512, minb=4))]
    cases += [(card(1, 203, 7, 7, "float16"), stream(vec=2, tpr=2, planes=16, block=128, minb=16))]

    async def build_all() -> list[str]:
        rendered = [(spec, params, *TEMPLATE.render(spec, typed(TEMPLATE, spec, params))) for spec, params in cases]
        results = await asyncio.gather(
            *(sm90_builder.build(source, plan.entry, resolve(plan, spec).args) for spec, _, source, plan in rendered)
        )
        problems = []
        for (spec, params, _, plan), result in zip(rendered, results, strict=True):
            stats = result.ptxas.get(plan.entry)
            run_bytes = int(params["planes"]) * spec.sizes["h"] * spec.sizes["w"] * NUMPY[spec.inputs[0].dtype].itemsize
            if not result.ok or stats is None:
                problems.append(f"{spec.name} {params}: {result.log[-1500:]}")
            elif stats.spill_store_bytes or stats.spill_load_bytes or stats.shared_bytes != run_bytes:
                problems.append(f"{spec.name} {params}: {stats}")
        return problems

    assert all(canonical(TEMPLATE, spec, params) == params for spec, params in cases)
    assert asyncio.run(build_all()) == []


# -- the CPU emulator -------------------------------------------------------------------------------------------------

RUNNER = """
void run(const std::string& dir) {{
    const T* x = aligned<T>(slurp(dir + "/x.bin"));
    T* y = aligned<T>(std::vector<char>(sizeof(T) * {planes}));
    for (long long p = 0; p < {planes}; ++p) y[p] = from_f(NAN);
    emu::launch({grid}, {block}, [&] {{ {call}; }});
    std::ofstream(dir + "/y.bin", std::ios::binary).write(reinterpret_cast<const char*>(y), sizeof(T) * {planes});
}}
"""
EXPF = "inline float __expf(float v) { return std::exp(v); }\n"
"""The intrinsic the pooling kernels use that the emulator lacks."""
EMULATED_DTYPES = ("bfloat16", "float32")
EMULATED_SHAPES = [(3, 37, 7, 7), (2, 5, 8, 8), (4, 9, 1, 1), (1, 6, 14, 14), (2, 3, 5, 3)]


def emulated_variants(spec: OperatorCard) -> list[Params]:
    """The card's seeds (every stream one, the first direct one) and stream kernels with narrow loads, one lane
    or a warp a plane, and runs longer than the block."""
    seeds = [s.params for s in TemplateProposer().seeds(spec)]
    extra = [
        stream(vec=1, tpr=1, planes=8, block=64),
        stream(tpr=32, planes=16, block=128),
        stream(planes=128, block=64),
    ]
    chosen = [p for p in seeds if p["strategy"] == "stream"] + [next(p for p in seeds if p["strategy"] == "direct")]
    for params in extra:
        canon = canonical(TEMPLATE, spec, {**params, "vec": min(int(params["vec"]), max(TEMPLATE.space(spec)["vec"]))})
        if canon is not None and canon not in chosen:
            chosen.append(canon)
    return chosen


def variant_namespace(index: int, spec: OperatorCard, params: Params) -> str:
    """The variant's kernel with a runner of its own: its launch (grid, block, arguments) is fixed at compile time."""
    source, plan = TEMPLATE.render(spec, typed(TEMPLATE, spec, params))
    launch = resolve(plan, spec)
    runner = RUNNER.format(planes=spec.sizes["n"] * spec.sizes["c"], grid=launch.grid[0],
                           block=launch.threads_per_block, call=launch_call(plan.entry, launch))  # fmt: skip
    return kernel_namespace(index, source, runner)


@pytest.fixture(scope="module")
def emulator(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, dict[str, list[tuple[OperatorCard, Params]]]]]:
    """One program a dtype running every variant of every shape (argv[1] the variant, then case directories)."""
    work = tmp_path_factory.mktemp("pool-emulator")
    chosen = {d: [(spec, p) for s in EMULATED_SHAPES for spec in [card(*s, d)] for p in emulated_variants(spec)]
              for d in EMULATED_DTYPES}  # fmt: skip
    programs = {}
    for dtype, variants in chosen.items():
        namespaces = [variant_namespace(i, spec, params) for i, (spec, params) in enumerate(variants)]
        programs[dtype] = emulation_source(namespaces, prelude=EXPF)
    build(work, programs)
    yield work, chosen


def input_sets(spec: OperatorCard) -> dict[str, np.ndarray]:
    """The seeded and a fresh set, and every stress set the pooling family runs (NaN, inf, large, tiny, ...)."""
    sets = {"seeded": draw_inputs(spec, 1)["x"], "fresh": draw_inputs(spec, 9001)["x"]}
    base = draw_inputs(spec, spec.stress.seed)
    sets.update({f"stress-{p.name}": draw(spec, p.name, base)["x"] for p in running(spec)})
    return sets


@pytest.mark.parametrize("dtype", EMULATED_DTYPES)
def test_every_variant_matches_the_float64_mean_on_every_set_in_emulation(
    emulator: tuple[Path, dict[str, list[tuple[OperatorCard, Params]]]], dtype: str
) -> None:
    work, chosen = emulator
    wrong = []
    cases: dict[str, tuple[Path, dict[str, np.ndarray]]] = {}
    for index, (spec, params) in enumerate(chosen[dtype]):
        if spec.name not in cases:
            sets = input_sets(spec)
            assert {"stress-nan-inf", "stress-large"} <= set(sets)
            for name, x in sets.items():
                (work / f"{spec.name}-{name}").mkdir(exist_ok=True)
                (work / f"{spec.name}-{name}" / "x.bin").write_bytes(np.ascontiguousarray(x).tobytes())
            cases[spec.name] = (work, sets)
        sets = cases[spec.name][1]
        directories = [work / f"{spec.name}-{name}" for name in sets]
        ran = subprocess.run([str(work / dtype), str(index), *map(str, directories)], capture_output=True, text=True)
        assert ran.returncode == 0, (spec.name, params, ran.stderr)
        tolerance = spec.outputs[0].effective_tolerance()
        hw = spec.sizes["h"] * spec.sizes["w"]
        for (name, x), directory in zip(sets.items(), directories, strict=True):
            y = np.frombuffer((directory / "y.bin").read_bytes(), NUMPY[dtype])
            with np.errstate(invalid="ignore", over="ignore"):
                want = x.astype(np.float64).reshape(-1, hw).mean(axis=1).astype(NUMPY[dtype])
            off = np.count_nonzero(~tolerance.accepts(y, want))
            if off:
                wrong.append(f"{spec.name} {params} on {name}: {off} of {y.size} means off")
    assert wrong == []
    partial = [
        p
        for spec, p in chosen[dtype]
        if p["strategy"] == "stream" and spec.sizes["c"] * spec.sizes["n"] % int(p["planes"])
    ]
    assert len(partial) >= 5, "most variants end in a partial run"
