"""Golden renders of the static kernels: the sha256 of every suite task's baseline source (each precision) and of
every captured card's baseline (each family and dtype, a few eps values), read from their .cu files.

Why: a baseline is what every speedup is measured against and what a recorded run's card holds, so a change to its
text must be a reviewed change. Updating the digests: tests/support/golden_digests.py.
"""

from __future__ import annotations

from kernelforge_tui.capture import baselines
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import TASKS
from tests.support.golden_digests import assert_matches_golden, sha256

EPS = (1e-5, 1e-6, 0.1, 1.0)


def _digests(made: tuple[str, LaunchPlan]) -> str:
    source, plan = made
    return f"{sha256(source)} {sha256(plan.model_dump_json())}"


def test_every_suite_baseline_matches_its_golden_digest() -> None:
    got = {
        f"{task.name} {precision}": sha256(suite_cards.baseline_source(task, precision))
        for task in TASKS.values()
        for precision in task.precisions
    }
    assert_matches_golden("baseline_renders.json", "suite", got)


def test_every_capture_baseline_matches_its_golden_digest() -> None:
    got: dict[str, str] = {}
    for dtype in baselines.DTYPES:
        for op, (arity, _) in baselines.ELEMENTWISE.items():
            got[f"elementwise {op} {dtype}"] = _digests(
                baselines.elementwise(op, dtype, ["a", "b"][:arity], "y", "d0 * d1")
            )
        got[f"softmax {dtype}"] = _digests(baselines.softmax(dtype))
        got[f"pooling {dtype}"] = _digests(baselines.pooling(dtype))
        for eps in EPS:
            for family in (baselines.rms_norm, baselines.layer_norm, baselines.group_norm, baselines.batch_norm):
                got[f"{family.__name__} {dtype} {eps!r}"] = _digests(family(dtype, eps))
    assert_matches_golden("baseline_renders.json", "capture", got)
