"""The 2D stencil's strip strategy in the stencil template: a thread walks a column strip of `ypt` rows and `vec`
columns, every row of it loaded once into registers, x-neighbours by warp shuffles.

Its rules and canonical forms beside the point kernels it joins (every configuration the template had stays), the
levers, the seeds (strips with 16-byte accesses first on the 8192^2 card), nvcc builds of the seeds without spills,
and the kernel's logic on the CPU: the emulator of tests/support/cuda_emulator.py (every CUDA thread a fiber, warp
shuffles barriers) runs strip kernels on grids of awkward sizes (odd nx and ny, nx under a warp's span, ny under a
strip's rows, a last block partly past the grid), whose outputs must agree with the suite's float64 reference on normal
inputs and on the stress sets the stencil runs (tiny, NaN and inf).
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
from kernelforge_tui.cards import stress
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.proposers.templates.stencil import StencilTemplate
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Arrays, Precision
from tests.conftest import canonical, typed
from tests.support.cuda_emulator import build, emulation_source, kernel_namespace

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16")
TEMPLATE = StencilTemplate()
OLD_SPACE = {"bx": (32, 64, 128), "by": (1, 2, 4, 8, 16), "smem": (0, 1), "ypt": (1, 2, 4)}
"""The 2D space before the strip strategy: every valid configuration of it is a point kernel now."""


def card(precision: Precision, ny: int = 8192, nx: int = 8192) -> OperatorCard:
    """The suite's stencil_2d card (8192^2 is past the suite's scales, as vs_torch writes it) resized to ny x nx."""
    spec = cards.spec(task("stencil_2d"), precision, 2**26, beyond=True)
    return spec.model_copy(update={"sizes": {"ny": ny, "nx": nx}, "name": f"stencil_2d_{precision}_{ny}x{nx}"})


def fp16_card() -> OperatorCard:
    spec = card("float32", 64, 64)
    tensors = {
        key: [t.model_copy(update={"dtype": "float16"}) for t in getattr(spec, key)] for key in ("inputs", "outputs")
    }
    return spec.model_copy(update={**tensors, "name": "stencil_2d_float16_64x64"})


def strip(**changes: int | str) -> Params:
    params: Params = {"strategy": "strip", "bx": 32, "by": 8, "smem": 0, "ypt": 8, "vec": 4, "minb": 4}
    return {**params, "hint": "stream", **changes}


def test_the_strip_rules_and_the_point_kernels_kept() -> None:
    big = card("float32")
    assert canonical(TEMPLATE, big, strip()) == strip()
    assert canonical(TEMPLATE, big, strip(smem=1)) == strip(), "a strip has no shared tile"
    odd = card("float32", 37, 70)
    assert "does not divide nx" in str(TEMPLATE.problem(odd, typed(TEMPLATE, odd, strip(vec=4))))
    assert TEMPLATE.problem(odd, typed(TEMPLATE, odd, strip(vec=2))) is None
    assert "exceeds 2048" in str(TEMPLATE.problem(big, typed(TEMPLATE, big, strip(by=16, minb=8))))
    assert "grid y" in str(
        TEMPLATE.problem(
            card("float32", 2**21, 64), typed(TEMPLATE, card("float32", 2**21, 64), strip(by=1, bx=64, ypt=1))
        )
    )
    point = canonical(TEMPLATE, big, strip(strategy="point", vec=2, minb=8, hint="stream", ypt=2))
    assert point == strip(strategy="point", vec=1, minb=1, hint="plain", ypt=2)
    source = TEMPLATE.render(big, typed(TEMPLATE, big, {**point, "smem": 1}))[0]
    assert "__shared__ float tile" in source and "__shfl" not in source
    for values in np.array(np.meshgrid(*OLD_SPACE.values())).T.reshape(-1, len(OLD_SPACE)):
        old = dict(zip(OLD_SPACE, map(int, values), strict=True))
        threads_ok = 64 <= old["bx"] * old["by"] <= 1024
        assert (canonical(TEMPLATE, big, {**point, **old}) is not None) == threads_ok, old
    assert "strategy" not in TEMPLATE.space(cards.spec(task("stencil_3d"), "float32", 2**10)), "3D keeps its space"


def test_the_levers_of_a_2d_card() -> None:
    big = card("float32")
    assert [lever.param for lever in TEMPLATE.levers_of(big, "memory_bandwidth")] == [
        "vec", "ypt", "smem", "hint", "bx"
    ]  # fmt: skip
    assert [lever.param for lever in TEMPLATE.levers_of(big, "memory_latency")] == ["minb", "ypt", "by", "bx"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_seeds_start_with_strips_of_the_widest_access_nx_allows(precision: Precision) -> None:
    wide = {"float32": 4, "bfloat16": 8}[precision]
    for spec, vec in ((card(precision), wide), (card(precision, 37, 70), 2), (card(precision, 5, 9), 1)):
        seeds = TemplateProposer().seeds(spec)
        assert seeds[0].params == strip(vec=vec, minb=4 if precision == "float32" else 2), spec.name
        assert seeds[0].plan.grid == [f"cdiv(nx, {32 * vec})", "cdiv(ny, 64)"] and seeds[0].plan.block == [256]
        assert [p.params["strategy"] for p in seeds] == ["strip"] * 3 + ["point"] * 4
        for proposal in seeds:
            args = resolve(proposal.plan, spec).args
            errors = [e for e in check_source(proposal.source, proposal.plan.entry, args=args) if e.severity == "error"]
            assert not errors, (spec.name, proposal.params, errors)


def test_the_strip_seeds_build_without_spills(sm90_builder: Builder) -> None:
    """Every strip seed of the 8192^2 cards, and the first of cards of awkward sizes (the source depends on the
    dtype and vec only: sizes are arguments) and of an fp16 card."""
    chosen = [(spec, p) for spec in (card("float32"), card("bfloat16")) for p in TemplateProposer().seeds(spec)[:3]]
    chosen += [(spec, TemplateProposer().seeds(spec)[0]) for spec in (card("float32", 37, 70), card("bfloat16", 5, 9))]
    chosen.append((fp16_card(), TemplateProposer().seeds(fp16_card())[0]))

    async def build_all() -> list[str]:
        results = await asyncio.gather(
            *(sm90_builder.build(p.source, p.plan.entry, resolve(p.plan, spec).args) for spec, p in chosen)
        )
        problems = []
        for (spec, proposal), result in zip(chosen, results, strict=True):
            stats = result.ptxas.get(proposal.plan.entry)
            if not result.ok or stats is None:
                problems.append(f"{spec.name} {proposal.params}: {result.log[-1500:]}")
            elif stats.spill_store_bytes or stats.spill_load_bytes:
                problems.append(f"{spec.name} {proposal.params}: spills {stats}")
        return problems

    assert asyncio.run(build_all()) == []


# -- emulation --------------------------------------------------------------------------------------------------

EXTRAS = r"""
// What the strip kernels use beyond the sparse kernels: the access words, bit casts, streaming stores, fp16, and a
// two-dimensional grid (blocks run in order, x fastest, as block_index walks them).
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct __half {
    uint16_t bits;
};
template <typename V>
void __stcs(V* p, V v) {
    *p = v;
}
float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
__nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return {b}; }
unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.bits; }
namespace emu {
unsigned grid_x = 1;
}
#undef blockIdx
#define blockIdx (Dim3{emu::block_index % emu::grid_x, emu::block_index / emu::grid_x, 0})
"""

RUNNER = r"""
// The grid in `dir` (u.bin) through the kernel; v.bin, poisoned with NaN before the launch, written there.
void run(unsigned grid_x, unsigned grid_y, unsigned block, int ny, int nx, const std::string& dir) {
    const T* u = aligned<T>(slurp(dir + "/u.bin"));
    T* v = aligned<T>(std::vector<char>(sizeof(T) * ny * nx));
    for (long i = 0; i < long(ny) * nx; ++i) v[i] = from_f(NAN);
    emu::grid_x = grid_x;
    emu::launch(grid_x * grid_y, block, [&] { kf_stencil2d(u, v, ny, nx); });
    std::ofstream(dir + "/v.bin", std::ios::binary).write(reinterpret_cast<const char*>(v), sizeof(T) * ny * nx);
}
"""


ARGUMENTS = ("unsigned", "unsigned", "unsigned", "int", "int")
"""The runner's grid x, grid y, block, ny and nx: the program's argv[2..6]."""


GRIDS = ((37, 70), (64, 128), (5, 9), (19, 260), (66, 8))
"""Odd nx and ny; one warp's span exactly; ny under a strip's rows and nx under a warp's; 260 columns = two warps of
128 and a block mostly past the grid; a grid narrower than a warp's 16-byte span (bf16: 8 columns, one lane)."""


def variants(precision: Precision) -> list[Params]:
    """The strip seeds at every vec, then warps side by side in a block (the shuffles' edges inside a block), a
    row a strip (only halo rows), 16-row strips, plain hints, 1024-thread blocks."""
    seeds = [p.params for p in TemplateProposer().seeds(card(precision)) if p.params["strategy"] == "strip"]
    widths = {"float32": (4, 2, 1), "bfloat16": (8, 2, 1)}[precision]
    return [
        *({**seeds[0], "vec": vec} for vec in widths),
        *seeds[1:],
        strip(bx=128, by=1, ypt=1, vec=widths[0], minb=1),
        strip(bx=64, by=2, ypt=16, vec=2, hint="plain", minb=1),
        strip(bx=32, by=16, ypt=2, vec=1, hint="plain", minb=2),
        strip(bx=128, by=8, ypt=4, vec=widths[0], minb=2),
    ]


def case_sets(spec: OperatorCard) -> dict[str, Arrays]:
    """Normal values (the suite's distribution) and the stress sets the stencil runs, drawn as the worker draws them."""
    rng = np.random.default_rng(spec.sizes["ny"] * 1000 + spec.sizes["nx"])
    shape = (spec.sizes["ny"], spec.sizes["nx"])
    base = {"u": rng.standard_normal(shape).astype(NUMPY[spec.inputs[0].dtype])}
    planned = stress.running(spec)
    assert {p.name for p in planned} == {"tiny", "nan-inf"}
    return {"normal": base, **{p.name: stress.draw(spec, p.name, base) for p in planned}}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[Precision, list[Params]]]]:
    """One program per precision running every variant, both compiled at once."""
    work = tmp_path_factory.mktemp("stencil-emulator")
    chosen = {precision: variants(precision) for precision in PRECISIONS}
    programs = {}
    for precision, params in chosen.items():
        kernels = [TEMPLATE.render(card(precision), typed(TEMPLATE, card(precision), p))[0] for p in params]
        namespaces = [kernel_namespace(index, source, RUNNER) for index, source in enumerate(kernels)]
        programs[precision] = emulation_source(namespaces, ARGUMENTS, prelude=EXTRAS)
    build(work, programs)
    yield work, chosen


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_strip_variant_agrees_with_the_reference_on_awkward_grids_in_emulation(
    emulator: tuple[Path, dict[Precision, list[Params]]], precision: Precision
) -> None:
    work, chosen = emulator
    stencil = task("stencil_2d")
    tolerance = stencil.tolerance[precision]
    wrong, ran_cases = [], 0
    for ny, nx in GRIDS:
        spec = card(precision, ny, nx)
        sets = case_sets(spec)
        directories = {}
        for name, inputs in sets.items():
            directory = work / f"{precision}-{ny}x{nx}-{name}"
            directory.mkdir(exist_ok=True)
            (directory / "u.bin").write_bytes(np.ascontiguousarray(inputs["u"]).tobytes())
            directories[name] = directory
        for index, params in enumerate(chosen[precision]):
            if canonical(TEMPLATE, spec, params) != params:
                continue  # vec does not divide nx
            launch = resolve(TEMPLATE.render(spec, typed(TEMPLATE, spec, params))[1], spec)
            grid = [str(g) for g in launch.grid[:2]]
            command = [str(work / precision), str(index), *grid, str(launch.threads_per_block), str(ny), str(nx)]
            ran = subprocess.run([*command, *map(str, directories.values())], capture_output=True, text=True)
            assert ran.returncode == 0, (params, ran.stderr)
            for name, directory in directories.items():
                v = np.frombuffer((directory / "v.bin").read_bytes(), NUMPY[precision]).reshape(ny, nx)
                with np.errstate(invalid="ignore"):  # inf - inf in the reference: NaN, as the kernel must give
                    want = stencil.reference(sets[name], spec.sizes)["v"]
                off = np.count_nonzero(~tolerance.accepts(v, want))
                ran_cases += 1
                if off:
                    wrong.append(f"{params} on {ny}x{nx} {name}: {off} points off")
    assert wrong == []
    assert ran_cases >= 3 * 3 * len(GRIDS), "each grid runs several variants"
