"""The gemm_sm90 TMA mainloop through the product's own path on the GPU (`pytest -m gpu`): a render built in the
sandbox, launched by the worker with tensor maps it encodes over each set's buffers, proven on the seeded, fresh
and stress sets and the second run. Two layouts: K-major a and b with tails in M, N and K in a 2x1 cluster (b
multicast), and batched MN-major a and b, pingpong, in a 1x2 cluster (a multicast)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import load_card, save_card
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.config import Settings
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.proposers.templates.gemm_sm90 import GemmParams
from tests.proposers.templates.test_gemm_sm90 import TEMPLATE, TMA, gemm_card
from tests.support.cutlass_marks import needs_cutlass

pytestmark = [pytest.mark.gpu, needs_cutlass]
REFERENCE = """import numpy as np


def reference(inputs, sizes):
    a, b = inputs["a"].astype(np.float64), inputs["b"].astype(np.float64)
    return {"y": np.matmul(%s, %s)}
"""
CASES: dict[str, tuple[OperatorCard, GemmParams, tuple[str, str]]] = {
    "k_major_tails_2x1": (
        gemm_card(["M", "K"], ["N", "K"], {"M": 1000, "N": 520, "K": 776}, name="mm_tails_bf16"),
        TMA.but(tile_n=256, cluster_m=2),
        ("a", "np.swapaxes(b, -1, -2)"),
    ),
    "mn_major_batched_1x2": (
        gemm_card(["K", "M"], ["K", "N"], {"batch": 3, "M": 264, "N": 200, "K": 136}, name="bmm_mn_bf16"),
        TMA.but(schedule="pingpong", cluster_n=2),
        ("np.swapaxes(a, -1, -2)", "b"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tma_render_passes_every_set_through_the_worker(case: str, tmp_path: Path, cubin_cache: Path) -> None:
    card, params, operands = CASES[case]
    (tmp_path / "card").mkdir()
    (tmp_path / "card" / "reference.py").write_text(REFERENCE % operands)
    data: dict[str, Any] = card.model_dump()
    data["input_sets"] = [{"name": "seed_1", "seed": 1}, {"name": "seed_2", "seed": 2}]
    saved = save_card(OperatorCard.model_validate(data), tmp_path / "card", {})
    source, plan = TEMPLATE.render(card, params)
    settings = Settings.model_validate({"eval": {"timeout_s": 30.0, "fresh_seeds": 2}})
    evaluator = Evaluator(
        load_card(saved.root), Builder(arch="sm_90", cache_dir=cubin_cache), settings, require_gpu()[0]
    )

    async def run() -> Any:
        await evaluator.start()
        try:
            return await evaluator.evaluate(source, plan)
        finally:
            await evaluator.close()

    evaluation = asyncio.run(run())
    assert evaluation.ok, evaluation.reason
    assert evaluation.result is not None and all(check.ok for check in evaluation.result.checks)
    assert any(check.name.startswith("fresh-") for check in evaluation.result.checks)
