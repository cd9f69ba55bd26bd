"""Template seeds on the CPU emulator (tests/support/cuda_emulator.py), against the suite card's own reference on its
seeded and every stress set: what the GPU tests check on the H200, here without one. The rows template's norm kernels
(layer_norm, rms_norm: every seed, Welford among them; the Welford merge changed after a GPU run) and the elementwise
template's fast gelu (an erfc approximation)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.cards import Card, resolve
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task
from tests.conftest import typed
from tests.support.cuda_emulator import build, emulation_source, kernel_namespace, launch_call

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

RUNNER = """
void run(const std::string& dir) {{
{loads}{allocations}    emu::launch({grid}, {block}, [&] {{ {call}; }});
{writes}}}
"""
ALLOCATION = "    T* {out} = aligned<T>(std::vector<char>(sizeof(T) * {elements}));\n"
WRITE = """    std::ofstream(dir + "/{out}.out.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>({out}), sizeof(T) * {elements});
"""
"""Every output of the card is written to OUTPUT.out.bin (a chain that writes the residual sum too has two)."""
INTRINSICS = """inline float __expf(float v) { return std::exp(v); }
inline float __fdividef(float a, float b) { return a / b; }
"""
NORM_CASES = [(family, dtype) for family in ("layer_norm", "rms_norm") for dtype in ("float32", "bfloat16")]
FAST_CASES = [("gelu", "float32"), ("gelu", "bfloat16")]
SIZE = 2**14


def namespace(index: int, card: Card, params: Params) -> str:
    """The seed with its runner (its launch fixed at compile time)."""
    template = template_for(card.spec)
    assert template is not None
    source, plan = template.render(card.spec, typed(template, card.spec, params))
    launch = resolve(plan, card.spec)
    loads = "".join(f'    const T* {t.name} = aligned<T>(slurp(dir + "/{t.name}.bin"));\n' for t in card.spec.inputs)
    outputs = [(t.name, t.numel(card.spec.sizes)) for t in card.spec.outputs]
    allocations = "".join(ALLOCATION.format(out=name, elements=n) for name, n in outputs)
    writes = "".join(WRITE.format(out=name, elements=n) for name, n in outputs)
    runner = RUNNER.format(loads=loads, allocations=allocations, writes=writes, grid=launch.grid[0],
                           block=launch.threads_per_block, call=launch_call(plan.entry, launch))  # fmt: skip
    return kernel_namespace(index, source, runner, launch.shared_bytes)


Emulated = tuple[Path, dict[tuple[str, str], tuple[Card, list[Params]]]]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulated]:
    """Every case's card (the suite's, SIZE elements or rows) and seeds, built into one program per card."""
    work = tmp_path_factory.mktemp("template-emulator")
    chosen = {}
    for name, dtype in NORM_CASES + FAST_CASES:
        card = suite_cards.write(task(name), dtype, SIZE, work / "cards")
        chosen[name, dtype] = (card, [seed.params for seed in TemplateProposer().seeds(card.spec)])
    programs = {
        card.spec.name: emulation_source([namespace(i, card, p) for i, p in enumerate(seeds)], prelude=INTRINSICS)
        for card, seeds in chosen.values()
    }
    build(work, programs)
    yield work, chosen


def wrong_outputs(work: Path, card: Card, seeds: list[Params], program: str | None = None) -> list[str]:
    """Each seed on the card's own and every stress set in the emulator (the program `program`, by default the
    card's name): where one of its outputs leaves the tolerance."""
    program = program or card.spec.name
    sets = {s.name: card.input_set(s) for s in card.spec.input_sets}
    sets.update({name: (inputs, outputs) for name, inputs, outputs in card.stress_sets()})
    assert any(name.startswith("stress:") for name in sets)
    directories = []
    for name, (inputs, _) in sets.items():
        directory = work / f"{program}-{name.replace(':', '-')}"
        directory.mkdir(exist_ok=True)
        for tensor, array in inputs.items():
            (directory / f"{tensor}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
        directories.append(directory)
    wrong = []
    for index, params in enumerate(seeds):
        ran = subprocess.run([str(work / program), str(index), *map(str, directories)], capture_output=True,
                             text=True)  # fmt: skip
        assert ran.returncode == 0, (params, ran.stderr)
        for (name, (_, outputs)), directory in zip(sets.items(), directories, strict=True):
            for output in card.spec.outputs:
                got = np.frombuffer((directory / f"{output.name}.out.bin").read_bytes(), NUMPY[output.dtype])
                want = np.asarray(outputs[output.name]).reshape(-1)
                off = np.count_nonzero(~output.effective_tolerance().accepts(got, want))
                if off:
                    wrong.append(f"{params} on {name}: {output.name} {off} of {got.size} off")
    return wrong


@pytest.mark.parametrize(("family", "dtype"), NORM_CASES)
def test_every_norm_seed_matches_the_cards_reference_on_every_set(emulated: Emulated, family: str, dtype: str) -> None:
    work, chosen = emulated
    card, seeds = chosen[family, dtype]
    assert any(p.get("welford") for p in seeds) == (family == "layer_norm")
    stress = {name for name, _, _ in card.stress_sets()}
    assert {"stress:large", "stress:large-mean", "stress:equal-rows"} <= stress or family == "rms_norm"
    assert wrong_outputs(work, card, seeds) == []


@pytest.mark.parametrize(("name", "dtype"), FAST_CASES)
def test_every_fast_math_seed_matches_the_cards_reference_on_every_set(
    emulated: Emulated, name: str, dtype: str
) -> None:
    """The fast forms' arithmetic (gelu: Abramowitz and Stegun's erfc, no 1 + erf cancellation; NaN, inf and the
    largest finite values of the stress sets) within the suite card's tolerance; the intrinsics are exact here, their
    few ulp are the GPU test's (tests/gpu/test_stress.py)."""
    work, chosen = emulated
    card, seeds = chosen[name, dtype]
    assert [p["fast_math"] for p in seeds].count(1) >= 3 and [p["fast_math"] for p in seeds].count(0) == 1
    assert wrong_outputs(work, card, seeds) == []
