"""The roofline floor (issue 30), on any machine: the least time a card's counted work can take on a GPU, and the
evaluator's refusal of a candidate whose timed launches beat it. tests/gpu/test_verifier.py shows it on the H200."""

from __future__ import annotations

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import load_card
from kernelforge_tui.config import Settings
from kernelforge_tui.gpu.detect import GpuInfo
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.gpu.ncu.hardware import roofline_floor
from kernelforge_tui.vocabulary.evaluation import BuildResult, Ceilings, EvalResult, Evaluation, Timing
from tests.conftest import EXAMPLES

H200 = Ceilings(gpu_name="NVIDIA H200", copy_gbps=4000.0, fma_tflops=60.0, capability=(9, 0), sm_count=132,
                l2_bytes=60 << 20)  # fmt: skip
VECTOR_ADD_BYTES = 12 * 2**25
"""vector_add_f32's counted bytes: two reads and a write of 2^25 floats (402.7 MB, 100.7 us at 4000 GB/s)."""


def test_the_floor_is_the_bytes_at_the_copy_ceiling_or_the_flops_at_the_compute_ceiling() -> None:
    memory = roofline_floor(2**25, VECTOR_ADD_BYTES, H200, ["float32", "float32"])
    assert memory.bound == "memory" and memory.seconds == pytest.approx(VECTOR_ADD_BYTES / 4000e9)
    assert memory.limit == "402.7 MB at the measured copy ceiling of 4000 GB/s"
    matmul = 2 * 4096**3
    tensor = roofline_floor(matmul, 3 * 2 * 4096**2, H200, ["bfloat16", "bfloat16"])
    assert tensor.bound == "compute" and tensor.seconds == pytest.approx(matmul / 960e12)
    assert tensor.limit == "137.4 GFLOP at the compute ceiling of 960 TFLOP/s"
    fp32 = roofline_floor(matmul, 3 * 4 * 4096**2, H200, ["float32"])
    assert fp32.seconds == pytest.approx(matmul / 60e12)
    assert roofline_floor(0, 0, H200).seconds == 0


def judge(timing: Timing | None) -> Evaluation:
    """The evaluator's verdict on a vector_add_f32 candidate with this timing (None: untimed) on the H200."""
    gpu = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-0", capability="9.0", driver="1", memory_mib=1)
    card = load_card(EXAMPLES / "cards" / "vector_add_f32")
    evaluator = Evaluator(card, Builder(arch="sm_90"), Settings(), gpu, worker=object())  # type: ignore[arg-type]
    evaluator.ceilings = H200
    return evaluator._judge(EvalResult(ok=True, candidate=timing), BuildResult(ok=True, key="k"))


def timed(median_us: float, p10_us: float) -> Timing:
    return Timing(median_us=median_us, p10_us=p10_us, p90_us=median_us * 1.01, cv=0.01, reps=40)


def test_an_honest_kernel_near_the_ceiling_passes() -> None:
    """At 102% of the copy ceiling by its median (as the vec4 candidate measured on the H200), a tenth at 105%."""
    evaluation = judge(timed(98.7, 95.9))
    assert evaluation.ok, evaluation.reason
    assert evaluation.ceiling_share == pytest.approx(100.66 / 98.7, rel=1e-3)


def test_a_kernel_faster_than_the_floor_on_a_tenth_of_its_launches_is_impossible() -> None:
    """Its median is honest (102% of the ceiling), but a tenth of its launches took 60 us, where moving the card's
    bytes takes 100.7 us at least."""
    evaluation = judge(timed(98.7, 60.0))
    assert not evaluation.ok and evaluation.failure == "cheat"
    assert evaluation.reason == (
        "impossible: a tenth of its timed launches took 60 us or less, under the roofline floor of 101 us (402.7 MB "
        "at the measured copy ceiling of 4000 GB/s): 168% of the speed physics allows, limit 110%; it must skip work "
        "the operator requires"
    )


def test_an_untimed_candidate_is_not_held_to_the_floor() -> None:
    evaluation = judge(None)
    assert evaluation.ok and evaluation.ceiling_share is None
