"""The templates the CPU emulator proved for the suite's former no-template tasks (convolution, the contraction
through matmul, matrix_power, attention), on the H200 (`pytest -m gpu`): every seed through the worker's checks
(seeded, fresh and every stress set) with the GPU's own rounding, fma contraction and __expf, at 2^18 (every task's
kernels at a size where the grids span the SMs) in both precisions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.suite.task import PRECISIONS, Precision
from tests.gpu.test_stress import failing_seeds

pytestmark = pytest.mark.gpu

TASKS = ("conv_1d", "conv_2d", "high_order_contraction", "matrix_power", "softmax_attention", "triangle_attention")


@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("name", TASKS)
def test_every_seed_passes_every_set_on_the_gpu(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, name: str, dtype: Precision
) -> None:
    card = suite_cards.write(task(name), dtype, 2**18, tmp_path)
    assert loop.run_until_complete(failing_seeds(card)) == []
