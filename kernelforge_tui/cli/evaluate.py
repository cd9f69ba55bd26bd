"""`kernelforge eval`: build, prove correct and time one kernel against a card's baseline, and show the verdict."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.cards import load_card, plan_for_kernel, stress
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cli.output import EXIT_FAILED, EXIT_OK
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.backend import make_builder
from kernelforge_tui.errors import BadInput, not_utf8
from kernelforge_tui.gpu.detect import NoGpuError, detect_gpus, require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator, build_candidate
from kernelforge_tui.vocabulary.evaluation import Evaluation, speedup_text


def kernel_source(path: Path) -> str:
    """A kernel file given on the command line; BadInput when it cannot be read as text."""
    try:
        return path.read_text()
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: {not_utf8(exc)}: save it as UTF-8") from None
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror or exc}: give a CUDA source file") from None


async def _evaluate(card: Card, kernel: Path, plan_path: Path | None) -> Evaluation:
    """The plan check, the source check and the build run first, with or without a GPU: a plan that does not fit
    the card is bad input (exit 2), and a kernel that fails the source check or the build fails here (exit 1), on
    any machine; only one that passes them asks for the GPU."""
    settings = load_settings()
    plan = plan_for_kernel(kernel, plan_path, card.spec)
    source = kernel_source(kernel)
    gpus = detect_gpus()
    builder = make_builder(settings, gpus[0].arch if gpus else None)
    prepared = await build_candidate(card, builder, source, plan)
    if isinstance(prepared, Evaluation):
        return prepared
    try:
        gpu = require_gpu()[0]
    except NoGpuError as exc:
        raise NoGpuError(
            f"{exc} ({kernel.name} built and its launch plan fits the card; running it needs the GPU)"
        ) from None
    evaluator = Evaluator(card, builder, settings, gpu)
    try:
        await evaluator.start()
        return await evaluator.evaluate(source, plan)
    finally:
        await evaluator.close()


def render_evaluation(
    evaluation: Evaluation, console: Console, copy_gbps: float | None = None, skipped: Sequence[stress.Planned] = ()
) -> None:
    """The human view of one verdict: a row per input set, the stress sets the card skips (a skipped set proves
    nothing, so its reason is shown beside the sets that ran), then timing against the baseline."""
    result = evaluation.result
    if evaluation.build is not None:
        build = evaluation.build
        stats = ", ".join(
            f"{k}: {v.registers} regs, {v.shared_bytes} B smem, {v.spill_store_bytes} B spills"
            for k, v in build.ptxas.items()
        )
        console.print(f"build: {'cached' if build.cached else f'{build.seconds:.2f} s'}  {stats}")
    if result is not None and result.checks:
        table = Table(title="correctness")
        for column in ("input set", "", "worst error / tolerance", "bad", "never written"):
            table.add_column(column)
        for check in result.checks:
            table.add_row(
                check.name,
                "[green]pass[/]" if check.ok else "[red]FAIL[/]",
                f"{check.max_error_ratio:.3g}",
                str(check.bad),
                str(check.unwritten),
            )
        console.print(table)
    for planned in skipped:
        console.print(f"[yellow]{escape(planned.describe())}[/]")
    if result is not None and result.candidate is not None:
        table = Table(title="timing (CUDA events, L2 flushed, interleaved with the baseline)")
        for column in ("kernel", "median", "p10-p90", "cv", "reps"):
            table.add_column(column)
        for name, t in (("candidate", result.candidate), ("baseline", result.baseline)):
            if t is not None:
                table.add_row(
                    name, f"{t.median_us:.2f} us", f"{t.p10_us:.2f}-{t.p90_us:.2f} us", f"{t.cv:.2%}", str(t.reps)
                )
        console.print(table)
        parts = []
        if result.speedup is not None:
            parts.append(f"speedup over the baseline: [bold]{speedup_text(result.speedup, result.speedup_interval)}[/]")
        if result.achieved_gbps is not None:
            parts.append(f"{result.achieved_gbps:.0f} GB/s")
        if evaluation.ceiling_share is not None:
            parts.append(f"{evaluation.ceiling_share:.0%} of the measured ceiling")
        console.print("  ".join(parts))
    if evaluation.ok:
        console.print(
            "[green bold]correct[/]" + ("" if result and result.deterministic else " (not bitwise deterministic)")
        )
    else:
        console.print(f"[red bold]{evaluation.failure}[/]: {escape(evaluation.reason)}")


def cmd_eval(args: argparse.Namespace, console: Console) -> int:
    card = load_card(Path(args.card))
    evaluation = asyncio.run(_evaluate(card, Path(args.kernel), Path(args.plan) if args.plan else None))
    skipped = [planned for planned in stress.plan(card.spec) if planned.skipped]
    if args.json:
        reply = json.loads(evaluation.model_dump_json())
        reply["skipped_stress_sets"] = {planned.label: planned.skipped for planned in skipped}
        print(json.dumps(reply, indent=2))
    else:
        render_evaluation(evaluation, console, skipped=skipped)
    return EXIT_OK if evaluation.ok else EXIT_FAILED
