"""GPU check (not a test): every suite card's baseline through its own verification, as `kernelforge eval` runs it.

For each selected task x precision x scale, the card is written and its baseline kernel evaluated as a candidate
against itself by the same Evaluator `kernelforge eval CARD baseline.cu` uses: built with nvcc, proven on the card's
seeded sets, fresh sets and the family's stress sets (canaries, the second run, determinism, the timed runs), then
timed with the L2 flushed. A baseline that fails its own verification has a wrong baseline, reference or tolerance;
the bench cannot score a task whose baseline fails. One GPU worker process serves every card (each Evaluator loads
its card into it), so hundreds of cards cost one CUDA context. The summary is rewritten after every card, so a crash
leaves what was checked.

    python bench/suite_baselines.py [--tasks GLOB ...] [--precision fp32|bf16|both] [--scales 10,14,18,22] --out DIR

writes DIR/baselines.json and DIR/baselines.md (pass or fail per card, the baseline's median latency, the failure),
with the cards under DIR/cards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cli.bench import PRECISION_CHOICES, parse_scales
from kernelforge_tui.config import Settings, load_settings
from kernelforge_tui.engine.backend import make_builder
from kernelforge_tui.engine.bench import BenchCard, BenchOptions, plan_cards
from kernelforge_tui.errors import BaselineFailed, KernelForgeError
from kernelforge_tui.gpu.detect import GpuInfo, require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator, GpuWorker
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.nodes import FailureKind

JSON_NAME = "baselines.json"
MD_NAME = "baselines.md"


class BaselineCheck(BaseModel):
    """One card's baseline against its own verification."""

    card: str
    task: str
    precision: str
    log2_scale: int
    ok: bool
    failure: str | None = None
    reason: str = ""
    median_us: float | None = None
    sets: int = 0
    """Input sets checked (seeded, fresh and stress)."""
    seconds: float = 0.0
    """Wall time of the card's check (load, build, verification, timing)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", action="extend", metavar="GLOB", help="task names or globs (all)")
    parser.add_argument("--precision", choices=list(PRECISION_CHOICES), default="both")
    parser.add_argument("--scales", nargs="+", action="extend", metavar="LOG2", help="e.g. 10,14 (every scale)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="where the cards and summary go")
    return parser.parse_args(argv)


def selected(args: argparse.Namespace) -> list[BenchCard]:
    """The cards to check, as `kernelforge bench` selects them."""
    options = BenchOptions(
        tasks=args.tasks or [], precisions=PRECISION_CHOICES[args.precision], scales=parse_scales(args.scales)
    )
    return plan_cards(options)


def check_of(card: BenchCard, evaluation: Evaluation, seconds: float) -> BaselineCheck:
    result = evaluation.result
    return BaselineCheck(
        card=card.card,
        task=card.task,
        precision=card.precision,
        log2_scale=card.log2_scale,
        ok=evaluation.ok,
        failure=evaluation.failure,
        reason="" if evaluation.ok else evaluation.reason,
        median_us=result.candidate.median_us if result is not None and result.candidate is not None else None,
        sets=len(result.checks) if result is not None else 0,
        seconds=seconds,
    )


def write_summary(checks: Sequence[BaselineCheck], total: int, out: Path) -> None:
    """DIR/baselines.json and DIR/baselines.md: every card checked so far, failures first in the Markdown."""
    passed = sum(c.ok for c in checks)
    summary = {"cards": total, "checked": len(checks), "passed": passed, "results": [c.model_dump() for c in checks]}
    (out / JSON_NAME).write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "# Suite baselines against their own verification",
        "",
        f"{passed} of {len(checks)} checked cards pass ({total} selected).",
        "",
        "| card | result | baseline median | sets | failure |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in sorted(checks, key=lambda c: c.ok):
        median = "-" if c.median_us is None else f"{c.median_us:.3g} us"
        failure = f"{c.failure}: {c.reason}".replace("|", "\\|").replace("\n", " ") if not c.ok else ""
        lines.append(f"| {c.card} | {'pass' if c.ok else 'FAIL'} | {median} | {c.sets} | {failure} |")
    (out / MD_NAME).write_text("\n".join(lines) + "\n")


async def check_card(
    card: BenchCard, out: Path, settings: Settings, builder: Builder, gpu: GpuInfo, worker: GpuWorker
) -> BaselineCheck:
    """The card's baseline evaluated as `kernelforge eval CARD baseline.cu` evaluates it, in the shared worker."""
    started = time.monotonic()
    written = suite_cards.write(task(card.task), card.precision, card.scale, out / "cards")
    evaluator = Evaluator(written, builder, settings, gpu, worker=worker)  # not closed: the worker is shared
    try:
        await evaluator.start()
        assert written.spec.baseline is not None
        evaluation = await evaluator.evaluate(written.baseline_source(), written.spec.baseline.plan)
    except KernelForgeError as exc:  # the baseline does not build, the card does not load (memory, a reference)
        failure = FailureKind.COMPILE if isinstance(exc, BaselineFailed) else FailureKind.WORKER
        evaluation = Evaluation(ok=False, failure=failure, reason=f"{type(exc).__name__}: {exc}")
    return check_of(card, evaluation, time.monotonic() - started)


async def check_all(cards: Sequence[BenchCard], out: Path) -> list[BaselineCheck]:
    settings = load_settings()
    gpu = require_gpu()[0]
    builder = make_builder(settings, gpu.arch)
    worker = GpuWorker(gpu.index)
    checks: list[BaselineCheck] = []
    try:
        for card in cards:
            check = await check_card(card, out, settings, builder, gpu, worker)
            checks.append(check)
            write_summary(checks, len(cards), out)
            status = "pass" if check.ok else f"FAIL {check.failure}: {check.reason[:200]}"
            median = "-" if check.median_us is None else f"{check.median_us:.3g} us"
            print(f"{card.card:<40} {median:>12}  {status}", flush=True)
    finally:
        await worker.close()
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cards = selected(args)
    args.out.mkdir(parents=True, exist_ok=True)
    checks = asyncio.run(check_all(cards, args.out))
    passed = sum(c.ok for c in checks)
    print(f"{passed}/{len(checks)} baselines pass their own verification; summary in {args.out / MD_NAME}")
    return 0 if passed == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
