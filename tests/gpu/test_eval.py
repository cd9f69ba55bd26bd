"""GPU tests of the trust core: run on the H200 with `pytest -m gpu` (skipped nowhere: deselected in CI).

Each cheat kernel must be caught with the right failure kind and a reason that names what it did.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import load_card, plan_for_kernel, save_card
from kernelforge_tui.cards.model import Reference, StressSpec
from kernelforge_tui.cards.stress import FAMILIES
from kernelforge_tui.config import Settings
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.vocabulary.evaluation import Evaluation
from tests.conftest import EXAMPLES
from tests.support.gpu_harness import Harness, evaluate_once

pytestmark = pytest.mark.gpu
CARDS = EXAMPLES / "cards"
CHEATS = EXAMPLES / "kernels" / "cheats"


def candidates(card: str) -> list[Path]:
    return sorted((CARDS / card / "candidates").glob("*.cu"))


@pytest.mark.parametrize(
    "card",
    ["vector_add_f32", "softmax_f32_small", "softmax_bf16_small", "rms_norm_bf16_small"],
)
def test_hand_written_candidates_pass_and_are_timed(harness: Harness, card: str) -> None:
    for kernel in candidates(card):
        evaluation = harness.run(card, kernel)
        assert evaluation.ok, f"{kernel.name}: {evaluation.failure}: {evaluation.reason}"
        result = evaluation.result
        assert result is not None and result.candidate is not None and result.baseline is not None
        assert result.speedup is not None and result.speedup > 0
        assert all(check.ok for check in result.checks)
        assert len(result.checks) >= 3  # card sets + fresh sets + the second run
        assert evaluation.ceiling_share is not None and evaluation.ceiling_share < 1.1


def test_vector_add_candidate_beats_naive_baseline_within_ceiling(harness: Harness) -> None:
    evaluation = harness.run("vector_add_f32", candidates("vector_add_f32")[0])
    assert evaluation.ok and evaluation.result is not None
    assert evaluation.ceiling_share is not None and 0.3 < evaluation.ceiling_share < 1.1
    assert evaluation.result.candidate is not None and evaluation.result.candidate.cv < 0.05


CAUGHT = [
    ("vector_add_f32", "wrong_answer", "mismatch", "outside rtol"),
    ("vector_add_f32", "never_writes", "mismatch", "never written"),
    ("vector_add_f32", "out_of_bounds", "cheat", "past the end"),
    ("vector_add_f32", "infinite_loop", "timeout", "did not finish"),
    ("vector_add_f32", "caching", "mismatch", "set "),
    ("vector_add_f32", "modifies_input", "cheat", "modified its input"),
    ("softmax_bf16_small", "first_row_only", "mismatch", "never written"),
    ("softmax_bf16_small", "wrong_answer", "mismatch", "outside rtol"),
    ("softmax_bf16_small", "never_writes", "mismatch", "never written"),
    ("softmax_bf16_small", "out_of_bounds", "cheat", "past the end"),
    ("softmax_bf16_small", "caching", "mismatch", "set "),
    ("softmax_bf16_small", "modifies_input", "cheat", "modified its input"),
    ("vector_add_f32", "first_row_only", "mismatch", "never written"),
    ("softmax_f32_small", "half_precision", "mismatch", "outside rtol"),
    ("vector_add_f32", "reads_output", "mismatch", "second run on the same inputs, started from set "),
]


@pytest.mark.parametrize(("card", "cheat", "failure", "reason"), CAUGHT, ids=[f"{c[0]}-{c[1]}" for c in CAUGHT])
def test_cheats_are_caught_with_the_right_reason(
    harness: Harness, card: str, cheat: str, failure: str, reason: str
) -> None:
    evaluation = harness.run(card, CHEATS / card / f"{cheat}.cu")
    assert not evaluation.ok
    assert evaluation.failure == failure, evaluation.reason
    assert reason in evaluation.reason


def test_worker_recovers_after_a_cheat(harness: Harness) -> None:
    """After a timeout or a stray write killed the worker, the next good kernel still passes."""
    harness.run("vector_add_f32", CHEATS / "vector_add_f32" / "infinite_loop.cu")
    evaluation = harness.run("vector_add_f32", candidates("vector_add_f32")[0])
    assert evaluation.ok, evaluation.reason
    assert harness.evaluator("vector_add_f32").worker.restarts >= 1


def test_output_kept_from_before_the_launch_is_caught_in_the_timed_runs(loop: asyncio.AbstractEventLoop) -> None:
    """A kernel honest through every check that then keeps any output that is not NaN: caught because the timed
    launches start from stale results or noise, not the poison, and each is checked. Its 32 honest launches cover the
    9 sets (the card's 3, 2 fresh, 4 stress), the second run, the 3 warm-ups and 19 timed launches: the 20th
    (started from noise) is the first it keeps."""
    settings = Settings.model_validate({"eval": {"timeout_s": 10.0, "fresh_seeds": 2, "min_reps": 60, "max_reps": 60}})
    evaluator = Evaluator(load_card(CARDS / "vector_add_f32"), Builder(arch="sm_90"), settings, require_gpu()[0])
    evaluation = evaluate_once(loop, evaluator, CHEATS / "vector_add_f32" / "keeps_output_when_timed.cu")
    assert not evaluation.ok
    assert evaluation.failure == "cheat", evaluation.reason
    assert evaluation.reason.startswith("1 of its 20 timed launches gave a wrong output (launch 20)"), evaluation.reason
    assert "launch 20, started from random finite values: c: " in evaluation.reason
    assert evaluation.result is not None and all(check.ok for check in evaluation.result.checks)


def test_a_kernel_that_reads_only_what_it_wrote_passes(harness: Harness) -> None:
    """Reading the output is fine once this launch wrote it: the finite prefills must not flag it."""
    evaluation = harness.run("vector_add_f32", CHEATS / "vector_add_f32" / "reads_after_writing.cu")
    assert evaluation.ok, evaluation.reason
    assert evaluation.result is not None and evaluation.result.deterministic
    assert evaluation.result.checks[-1].name.endswith("(second run)") and evaluation.result.checks[-1].ok


@pytest.mark.parametrize(
    ("card", "kernel"),
    [("softmax_bf16_small", "half_precision_bf16"), ("softmax_f32_small", "reordered_reduction")],
)
def test_tolerances_accept_honest_rounding_differences(harness: Harness, card: str, kernel: str) -> None:
    """fp16 math under a bf16 output, and a reordered fp32 reduction, differ in the last bits yet pass;
    (the same fp16 shortcut under an fp32 output fails: see half_precision in CAUGHT)."""
    evaluation = harness.run(card, CHEATS / card / f"{kernel}.cu")
    assert evaluation.ok, evaluation.reason
    assert evaluation.result is not None
    assert max(check.max_error_ratio for check in evaluation.result.checks) > 0


ILLEGAL_ADDRESS = r"""
extern "C" __global__ void far_write(const float* a, const float* b, float* c, int n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) { c[1ll << 38] = 1.0f; }
}
"""


def test_illegal_address_kills_only_the_worker(harness: Harness) -> None:
    evaluator = harness.evaluator("vector_add_f32")
    plan = plan_for_kernel(candidates("vector_add_f32")[0]).model_copy(update={"entry": "far_write"})
    plan = plan.model_copy(update={"args": ["a", "b", "c", "n"], "grid": [1], "block": [32]})
    bad = harness.loop.run_until_complete(evaluator.evaluate(ILLEGAL_ADDRESS, plan))
    assert not bad.ok and bad.failure == "launch"
    assert "illegal" in bad.reason.lower() or "exited" in bad.reason
    good = harness.run("vector_add_f32", candidates("vector_add_f32")[0])
    assert good.ok, good.reason


def test_baseline_kernel_as_the_reference_for_fresh_inputs(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    """A card without a host reference: fresh and seeded sets are referenced by running its baseline."""
    source = load_card(CARDS / "vector_add_f32")
    spec = source.spec.model_copy(
        update={
            "name": "vector_add_baseline_ref",
            "sizes": {"n": 1_000_003},
            "reference": Reference(kind="baseline"),
            # Stress sets need a NumPy reference: a baseline can be the very kernel they would catch.
            "stress": StressSpec(skip=dict.fromkeys(FAMILIES["elementwise"].applies, "the reference is the baseline")),
        }
    )
    (tmp_path / "card").mkdir()
    shutil.copy(source.root / "baseline.cu", tmp_path / "card" / "baseline.cu")
    card = save_card(spec, tmp_path / "card", {})
    settings = Settings.model_validate({"eval": {"timeout_s": 10.0, "fresh_seeds": 2}})
    evaluator = Evaluator(card, Builder(arch="sm_90"), settings, require_gpu()[0])
    good, bad = candidates("vector_add_f32")[0], CHEATS / "vector_add_f32" / "wrong_answer.cu"

    async def run() -> tuple[Evaluation, Evaluation]:
        await evaluator.start()
        try:
            return (
                await evaluator.evaluate(good.read_text(), plan_for_kernel(good)),
                await evaluator.evaluate(bad.read_text(), plan_for_kernel(bad)),
            )
        finally:
            await evaluator.close()

    passed, caught = loop.run_until_complete(run())
    assert passed.ok, passed.reason
    assert passed.result is not None and len(passed.result.checks) == 3 + 2 + 1
    assert not caught.ok and caught.failure == "mismatch"
