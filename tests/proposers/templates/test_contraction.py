"""The matmul template on the suite's high_order_contraction, C[a, b, c] = sum over d, e of A[a, d, e] B[d, b, e, c]:
a product of A [a, (d e)] and B [(d e), (b c)] whose fma kernel reads B through the contraction's own index
(cuda/matmul_fma.cu, `contraction`). Which strategy serves it (fma: tc copies B as a plain [K, N] matrix), every
seed on the CPU emulator (tests/support/cuda_emulator.py, on a two-dimensional grid) against the suite's float64
einsum on the seeded sets in both precisions, and the seeds of the 2^22 cards built with nvcc (no spills)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import Card, resolve
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.common import Params
from kernelforge_tui.proposers.templates.matmul import MatmulTemplate
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import Precision
from tests.conftest import typed
from tests.support.cuda_emulator import build, emulation_source, kernel_namespace, launch_call
from tests.support.seed_builds import build_problems

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture builds once, on one worker

PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16")
GRID_2D = """namespace emu {
unsigned grid_x = 1;
}
#undef blockIdx
#define blockIdx (Dim3{emu::block_index % emu::grid_x, emu::block_index / emu::grid_x, 0})
"""
"""A two-dimensional grid: blocks run in order, x fastest."""
RUNNER = """
void run(const std::string& dir) {{
{loads}    T* {out} = aligned<T>(std::vector<char>(sizeof(T) * {elements}));
    emu::grid_x = {grid_x};
    emu::launch({blocks}, {block}, [&] {{ {call}; }});
    std::ofstream(dir + "/{out}.out.bin", std::ios::binary).write(reinterpret_cast<const char*>({out}),
                                                                 sizeof(T) * {elements});
}}
"""
LOAD = '    const T* {name} = aligned<T>(slurp(dir + "/{name}.bin"));\n'


def namespace(index: int, card: Card, params: Params) -> str:
    """The seed with its runner, for cards of one output and a grid of one or two dimensions (the matmul family's:
    they have no stress sets, so `test_emulation.wrong_outputs` does not take them)."""
    template = template_for(card.spec)
    assert template is not None
    source, plan = template.render(card.spec, typed(template, card.spec, params))
    launch = resolve(plan, card.spec)
    (output,) = card.spec.outputs
    runner = RUNNER.format(loads="".join(LOAD.format(name=t.name) for t in card.spec.inputs), out=output.name,
                           elements=output.numel(card.spec.sizes), grid_x=launch.grid[0],
                           blocks=launch.grid[0] * launch.grid[1], block=launch.threads_per_block,
                           call=launch_call(plan.entry, launch))  # fmt: skip
    return kernel_namespace(index, source, runner, launch.shared_bytes)


def wrong_on_seeded_sets(work: Path, card: Card, seeds: list[Params]) -> list[str]:
    """Each seed (the program `work`/card name, `namespace`s in the seeds' order) on the card's seeded sets: where
    its output leaves the tolerance."""
    (output,) = card.spec.outputs
    wrong = []
    for which in card.spec.input_sets:
        inputs, outputs = card.input_set(which)
        directory = work / f"{card.spec.name}-{which.name}"
        directory.mkdir()
        for tensor, array in inputs.items():
            (directory / f"{tensor}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
        for index, params in enumerate(seeds):
            ran = subprocess.run([str(work / card.spec.name), str(index), str(directory)], capture_output=True)
            assert ran.returncode == 0, (params, ran.stderr)
            got = np.frombuffer((directory / f"{output.name}.out.bin").read_bytes(), NUMPY[output.dtype])
            off = ~output.effective_tolerance().accepts(got, np.asarray(outputs[output.name]).reshape(-1))
            if off.any():
                wrong.append(f"{params} on {which.name}: {off.sum()} of {got.size} off")
    return wrong


def test_the_contraction_is_served_by_the_fma_kernel_only() -> None:
    spec = suite_cards.spec(task("high_order_contraction"), "bfloat16", 2**22)
    template = template_for(spec)
    assert isinstance(template, MatmulTemplate)
    seeds = TemplateProposer().seeds(spec)
    assert seeds and {p.params["strategy"] for p in seeds} == {"fma"}
    assert seeds[0].plan.args == ["A", "B", "C", "a", "(b) * (c)", "(d) * (e)"]
    assert template.space(spec)["strategy"] == ("fma",), "tc copies B as a [K, N] matrix"
    small = suite_cards.spec(task("high_order_contraction"), "float32", 2**10)  # c = 8
    wide = typed(template, small, {**TemplateProposer().seeds(small)[0].params, "vec": 4} | {"bn": 32})
    assert template.problem(small, wide) is None
    narrow = small.model_copy(update={"sizes": {**small.sizes, "c": 2, "b": 16}})
    assert "vec 4 does not divide c = 2" in str(template.problem(narrow, wide))


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[Card, list[Params]]]]:
    """Each precision's 2^14 card (a 128, b 8, c 16, d 16, e 8) with its seeds, one program each."""
    work = tmp_path_factory.mktemp("contraction-emulator")
    chosen = []
    for precision in PRECISIONS:
        card = suite_cards.write(task("high_order_contraction"), precision, 2**14, work / "cards")
        chosen.append((card, [p.params for p in TemplateProposer().seeds(card.spec)]))
    build(work, {card.spec.name: emulation_source([namespace(i, card, p) for i, p in enumerate(seeds)],
                                                  prelude=GRID_2D) for card, seeds in chosen})  # fmt: skip
    return work, chosen


def test_every_contraction_seed_matches_the_reference_on_the_seeded_sets(
    emulated: tuple[Path, list[tuple[Card, list[Params]]]],
) -> None:
    """The matmul family has no stress sets yet (cards/stress.py), so the seeded sets only."""
    work, chosen = emulated
    for card, seeds in chosen:
        assert len(seeds) >= 4 and list(card.stress_sets()) == []
        assert wrong_on_seeded_sets(work, card, seeds) == []


def test_the_seeds_build_without_spills(sm90_builder: Builder) -> None:
    chosen = [
        (spec, proposal)
        for precision in PRECISIONS
        for spec in [suite_cards.spec(task("high_order_contraction"), precision, 2**22)]
        for proposal in TemplateProposer().seeds(spec)
    ]

    assert build_problems(sm90_builder, chosen) == []
