"""The rows template's norm kernels (layer_norm, rms_norm: every seed, Welford among them) on the CPU emulator
(tests/cuda_emulator.py), against the suite card's own reference on its seeded and every stress set: what the GPU
tests check on the H200, here without one (the Welford merge changed after the last GPU run)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.cards import Card, resolve
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.proposers.templates.rows import RowTemplate
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task

from .cuda_emulator import build, emulation_source, kernel_namespace, launch_call

TEMPLATE = RowTemplate()
RUNNER = """
void run(const std::string& dir) {{
{loads}    T* y = aligned<T>(std::vector<char>(sizeof(T) * {elements}));
    emu::launch({grid}, {block}, [&] {{ {call}; }});
    std::ofstream(dir + "/y.bin", std::ios::binary).write(reinterpret_cast<const char*>(y), sizeof(T) * {elements});
}}
"""
EXPF = "inline float __expf(float v) { return std::exp(v); }\n"
CASES = [(family, dtype) for family in ("layer_norm", "rms_norm") for dtype in ("float32", "bfloat16")]


def namespace(index: int, card: Card, params: Params) -> str:
    """The seed with its runner (its launch fixed at compile time)."""
    source, plan = TEMPLATE.render(card.spec, params)
    launch = resolve(plan, card.spec)
    loads = "".join(f'    const T* {t.name} = aligned<T>(slurp(dir + "/{t.name}.bin"));\n' for t in card.spec.inputs)
    elements = card.spec.sizes["rows"] * card.spec.sizes["cols"]
    runner = RUNNER.format(loads=loads, elements=elements, grid=launch.grid[0], block=launch.threads_per_block,
                           call=launch_call(plan.entry, launch))  # fmt: skip
    return kernel_namespace(index, source, runner, launch.shared_bytes)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, tuple[Card, list[Params]]]]]:
    work = tmp_path_factory.mktemp("rows-emulator")
    chosen = {}
    for family, dtype in CASES:
        card = suite_cards.write(task(family), dtype, 2**14, work / "cards")
        chosen[card.spec.name] = (card, [seed.params for seed in TemplateProposer().seeds(card.spec)])
    programs = {
        name: emulation_source([namespace(i, card, p) for i, p in enumerate(seeds)], prelude=EXPF)
        for name, (card, seeds) in chosen.items()
    }
    build(work, programs)
    yield work, chosen


@pytest.mark.parametrize(("family", "dtype"), CASES)
def test_every_norm_seed_matches_the_cards_reference_on_every_set(
    emulated: tuple[Path, dict[str, tuple[Card, list[Params]]]], family: str, dtype: str
) -> None:
    work, chosen = emulated
    card, seeds = next(v for v in chosen.values() if v[0].spec.family == family and v[0].spec.inputs[0].dtype == dtype)
    assert any(p.get("welford") for p in seeds) == (family == "layer_norm")
    sets = {s.name: card.input_set(s) for s in card.spec.input_sets}
    sets.update({name: (inputs, outputs) for name, inputs, outputs in card.stress_sets()})
    assert {"stress:large", "stress:large-mean", "stress:equal-rows"} <= set(sets) or family == "rms_norm"
    directories = []
    for name, (inputs, _) in sets.items():
        directory = work / f"{card.spec.name}-{name.replace(':', '-')}"
        directory.mkdir(exist_ok=True)
        for tensor, array in inputs.items():
            (directory / f"{tensor}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
        directories.append(directory)
    output = card.spec.outputs[0]
    wrong = []
    for index, params in enumerate(seeds):
        ran = subprocess.run([str(work / card.spec.name), str(index), *map(str, directories)], capture_output=True,
                             text=True)  # fmt: skip
        assert ran.returncode == 0, (params, ran.stderr)
        for (name, (_, outputs)), directory in zip(sets.items(), directories, strict=True):
            got = np.frombuffer((directory / "y.bin").read_bytes(), NUMPY[output.dtype])
            want = np.asarray(outputs[output.name]).reshape(-1)
            off = np.count_nonzero(~output.effective_tolerance().accepts(got, want))
            if off:
                wrong.append(f"{params} on {name}: {off} of {got.size} off")
    assert wrong == []
