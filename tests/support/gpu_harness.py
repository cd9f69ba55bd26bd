"""What the GPU tests share: one evaluator per card, kept for a test module, and one-off evaluations."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import load_card, plan_for_kernel
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.config import Settings
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.vocabulary.evaluation import Evaluation
from tests.conftest import EXAMPLES

CARDS = EXAMPLES / "cards"


class Harness:
    """One evaluator per card, kept for the module: loading a card on the GPU costs seconds."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.evaluators: dict[str, Evaluator] = {}
        self.settings = Settings.model_validate({"eval": {"timeout_s": 10.0, "fresh_seeds": 2}})
        self.builder = Builder(arch="sm_90")

    def evaluator(self, card: str) -> Evaluator:
        if card not in self.evaluators:
            evaluator = Evaluator(load_card(CARDS / card), self.builder, self.settings, require_gpu()[0])
            self.loop.run_until_complete(evaluator.start())
            self.evaluators[card] = evaluator
        return self.evaluators[card]

    def run(self, card: str, kernel: Path, plan: LaunchPlan | None = None) -> Evaluation:
        """Evaluate `kernel` on `card`, launched by `plan` (default: the plan file beside the kernel)."""
        launch = plan if plan is not None else plan_for_kernel(kernel)
        return self.loop.run_until_complete(self.evaluator(card).evaluate(kernel.read_text(), launch))

    def close(self) -> None:
        for evaluator in self.evaluators.values():
            self.loop.run_until_complete(evaluator.close())


def evaluate_once(
    loop: asyncio.AbstractEventLoop, evaluator: Evaluator, kernel: Path, plan: LaunchPlan | None = None
) -> Evaluation:
    """Start `evaluator`, evaluate `kernel` launched by `plan` (default: the plan file beside it), close it: for a
    card or settings of its own."""
    launch = plan if plan is not None else plan_for_kernel(kernel)

    async def run() -> Evaluation:
        await evaluator.start()
        try:
            return await evaluator.evaluate(kernel.read_text(), launch)
        finally:
            await evaluator.close()

    return loop.run_until_complete(run())
