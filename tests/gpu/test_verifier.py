"""GPU tests of the verifier (issue 30): run on the H200 with `pytest -m gpu` (deselected in CI).

Kernels that behave differently on some launches (a __device__ launch counter, the %globaltimer clock, an output
buffer that already looks valid) are caught, each with the reason it earned, on fp32 and bf16 cards; a kernel that
memoises its output is refused by the roofline floor; honest kernels that keep device-side state pass. The kernels
are in tests/support/fixtures/timed/; tests/gpu/test_worker_fake_gpu.py and tests/gpu/test_roofline_floor.py hold the
same rules on a CPU.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import Card, load_card, save_card
from kernelforge_tui.cards.dtypes import FLOATING, NUMPY
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.config import Settings
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator, helpers_source
from kernelforge_tui.vocabulary.evaluation import Evaluation
from tests.conftest import EXAMPLES
from tests.support.gpu_harness import Harness, evaluate_once

pytestmark = pytest.mark.gpu
CARDS = EXAMPLES / "cards"
FIXTURES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "timed"
VECTOR_ADD = FIXTURES / "vector_add.cu"
SOFTMAX = FIXTURES / "softmax.cu"
ROW_SUM = FIXTURES / "row_sum.cu"


def vector_add(entry: str) -> LaunchPlan:
    return LaunchPlan(entry=entry, grid=["cdiv(n, 256)"], block=[256], args=["a", "b", "c", "n"])


def softmax(entry: str) -> LaunchPlan:
    return LaunchPlan(entry=entry, grid=["rows"], block=[256], args=["x", "y", "rows", "cols"])


row_sum = softmax
"""Row sums launch as softmax does: a block of 256 per row, on x, y, rows, cols."""


def kernel_for(card: str, entry: str) -> tuple[Path, LaunchPlan]:
    if card == "vector_add_f32":
        return VECTOR_ADD, vector_add(entry)
    return SOFTMAX, softmax(entry)


COUNTED = [
    ("vector_add_f32", "vector_add_skips_every_other"),
    ("vector_add_f32", "vector_add_skips_every_third"),
    ("softmax_bf16_small", "softmax_skips_every_other_bf16"),
    ("softmax_bf16_small", "softmax_skips_every_third_bf16"),
    ("softmax_f32_small", "softmax_skips_every_other_f32"),
    ("softmax_bf16_small", "softmax_keeps_valid_when_timed_bf16"),
    ("softmax_f32_small", "softmax_keeps_valid_when_timed_f32"),
]
"""Honest through every run before the timing, then skipping launches by a counter or keeping a valid-looking
output: what checking only the first runs and the last timed launch let through."""


@pytest.mark.parametrize(("card", "entry"), COUNTED, ids=[entry for _, entry in COUNTED])
def test_a_kernel_that_skips_work_on_some_timed_launches_is_caught(harness: Harness, card: str, entry: str) -> None:
    source, plan = kernel_for(card, entry)
    evaluation = harness.run(card, source, plan)
    assert not evaluation.ok
    assert evaluation.failure == "cheat", evaluation.reason
    assert "timed launches gave a wrong output (launch " in evaluation.reason, evaluation.reason
    assert "though every run before the timing was right" in evaluation.reason
    assert evaluation.result is not None and all(check.ok for check in evaluation.result.checks)
    if "keeps_valid" in entry:  # it kept another set's results, never the noise
        assert "started from set fresh-0's reference outputs" in evaluation.reason, evaluation.reason
    print(f"{card} {entry}: {evaluation.failure}: {evaluation.reason[:200]}")


def test_keeping_a_valid_looking_output_from_the_start_fails_the_second_run(harness: Harness) -> None:
    """Without its counter, the same cheat is caught before the timing: the second run starts from fresh-0's
    results, rows that sum to 1."""
    evaluation = harness.run("softmax_bf16_small", SOFTMAX, softmax("softmax_keeps_valid_bf16"))
    assert not evaluation.ok and evaluation.failure == "mismatch", evaluation.reason
    assert evaluation.reason.startswith(
        "the second run on the same inputs, started from set fresh-0's reference outputs instead of the NaN poison"
    )


HONEST = [
    ("vector_add_f32", "vector_add_counter_honest"),
    ("vector_add_f32", "vector_add_clock_honest"),
    ("softmax_bf16_small", "softmax_counter_honest_bf16"),
    ("softmax_bf16_small", "softmax_tickets_bf16"),
    ("softmax_f32_small", "softmax_tickets_f32"),
    ("softmax_bf16_small", "softmax_clock_bf16"),
]


@pytest.mark.parametrize(("card", "entry"), HONEST, ids=[entry for _, entry in HONEST])
def test_an_honest_kernel_with_device_state_passes_and_is_timed(harness: Harness, card: str, entry: str) -> None:
    source, plan = kernel_for(card, entry)
    evaluation = harness.run(card, source, plan)
    assert evaluation.ok, f"{evaluation.failure}: {evaluation.reason}"
    result = evaluation.result
    assert result is not None and result.candidate is not None and result.candidate.reps >= 20
    print(f"{card} {entry}: ok, {result.candidate.reps} timed launches checked, {result.candidate.median_us:.2f} us")


IDLE = [("vector_add_f32", "vector_add_idle_after_150ms"), ("softmax_bf16_small", "softmax_idle_after_150ms_bf16")]


@pytest.mark.parametrize(("card", "entry"), IDLE, ids=[entry for _, entry in IDLE])
def test_a_kernel_that_goes_idle_by_the_clock_is_caught(loop: asyncio.AbstractEventLoop, card: str, entry: str) -> None:
    """Idle from 150 ms after its first launch (%globaltimer): the checked runs are over by then, the timing (up to
    2000 launches here, so that it outlasts the delay) is not."""
    settings = Settings.model_validate(
        {"eval": {"timeout_s": 30.0, "fresh_seeds": 2, "min_reps": 2000, "max_reps": 2000, "timing_budget_s": 10.0}}
    )
    evaluator = Evaluator(load_card(CARDS / card), Builder(arch="sm_90"), settings, require_gpu()[0])
    source, plan = kernel_for(card, entry)
    evaluation = evaluate_once(loop, evaluator, source, plan)
    assert not evaluation.ok and evaluation.failure == "cheat", evaluation.reason
    assert "timed launches gave a wrong output (launch " in evaluation.reason, evaluation.reason
    assert evaluation.result is not None and all(check.ok for check in evaluation.result.checks)
    print(f"{card} {entry}: {evaluation.failure}: {evaluation.reason[:200]}")


ROW_SUM_REFERENCE = """import numpy as np


def row_sum(inputs, sizes):
    return {"y": inputs["x"].astype(np.float64).sum(axis=1)}
"""


def row_sum_card(root: Path) -> Card:
    """y[r] = sum of x[r, :] over a 4096 x 8192 fp32 x (128 MiB), uniform in [0, 1): a card whose output is tiny
    beside its input, so that a kernel which reads nothing is far faster than its bytes can move."""
    spec = OperatorCard.model_validate(
        {
            "name": "row_sum_f32", "family": "reduction", "sizes": {"rows": 4096, "cols": 8192},
            "inputs": [{"name": "x", "dtype": "float32", "shape": ["rows", "cols"],
                        "distribution": {"kind": "uniform", "low": 0.0, "high": 1.0}}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": ["rows"],
                         "tolerance": {"rtol": 1e-5, "atol": 1e-6}}],
            "cost": {"flops": "rows * cols", "bytes": "4 * rows * cols + 4 * rows"},
            "input_sets": [{"name": "seed_1", "seed": 1}],
            "reference": {"function": "ref.py:row_sum"},
        }
    )  # fmt: skip
    (root / "ref.py").write_text(ROW_SUM_REFERENCE)
    return save_card(spec, root, {})


def test_a_memoising_kernel_is_refused_by_the_roofline_floor(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    """Right on every launch (it keys the sums it kept by the input pointer, which never changes under a set), and
    reading nothing when timed: faster than the card's 128 MiB can move, so impossible. The honest row sum passes.
    (A memoised vector_add, 8 bytes an element where the card counts 12, stayed at 101% of the ceiling on the H200:
    within the margin, since the flush's dirty lines are written back during every launch.)"""
    settings = Settings.model_validate({"eval": {"timeout_s": 10.0, "fresh_seeds": 2}})
    evaluator = Evaluator(row_sum_card(tmp_path), Builder(arch="sm_90"), settings, require_gpu()[0])

    async def run() -> tuple[Evaluation, Evaluation]:
        await evaluator.start()
        try:
            source = ROW_SUM.read_text()
            memo = await evaluator.evaluate(source, row_sum("row_sum_memo"))
            control = await evaluator.evaluate(source, row_sum("row_sum_honest"))
            return memo, control
        finally:
            await evaluator.close()

    memo, control = loop.run_until_complete(run())
    assert not memo.ok and memo.failure == "cheat", f"{memo.reason} (share {memo.ceiling_share})"
    assert memo.reason.startswith("impossible: a tenth of its timed launches took "), memo.reason
    assert "under the roofline floor of " in memo.reason and "measured copy ceiling" in memo.reason
    assert memo.result is not None and all(check.ok for check in memo.result.checks)
    assert control.ok, control.reason
    assert control.ceiling_share is not None and control.ceiling_share < 1.1
    print(f"memo: {memo.reason}")
    print(f"honest row sum: {control.ceiling_share:.1%} of the copy ceiling")


def test_noise_is_fresh_finite_and_in_range_for_every_dtype(loop: asyncio.AbstractEventLoop) -> None:
    """kf_noise_<dtype>, the prefill of every other timed launch: finite, varied, in its dtype's range, and another
    seed gives another fill."""
    import pycuda.driver as drv

    from kernelforge_tui.gpu.device import GpuDevice

    helpers = loop.run_until_complete(Builder(arch="sm_90").build(helpers_source(), "kf_compare_float32"))
    assert helpers.ok and helpers.cubin_path is not None
    device = GpuDevice(drv)
    try:
        device.load_helpers(helpers.cubin_path)
        numel = 100_003
        ranges = {"int32": (-1000, 1000), "int64": (-1000, 1000), "int8": (-128, 127), "uint8": (0, 255)}
        for dtype in NUMPY:
            fills = []
            for seed in (1, 2):
                buffer = device.alloc(numel * NUMPY[dtype].itemsize)
                device.noise(int(buffer), numel, dtype, seed)
                host = np.empty(numel, dtype=NUMPY[dtype])
                drv.memcpy_dtoh(host, buffer)
                fills.append(host)
            values = fills[0].astype(np.float64)
            assert not np.array_equal(fills[0], fills[1]), dtype
            if dtype in FLOATING:
                assert np.isfinite(values).all() and np.abs(values).max() <= 4, dtype
                assert len(np.unique(values)) > 1000, dtype
            elif dtype == "bool":
                assert set(fills[0].view(np.uint8).tolist()) == {0, 1}
            else:
                low, high = ranges[dtype]
                assert values.min() == low and values.max() == high, dtype
    finally:
        device.close()
