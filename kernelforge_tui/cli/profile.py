"""`kernelforge profile`: Nsight Compute on a run's node or on a kernel file, with its bottleneck class."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.cards import load_card, plan_for_kernel
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cli.evaluate import kernel_source
from kernelforge_tui.cli.output import EXIT_OK
from kernelforge_tui.config import Settings, load_settings
from kernelforge_tui.engine.backend import make_builder
from kernelforge_tui.engine.setup import recorded_run
from kernelforge_tui.errors import BadInput
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.ncu.service import ProfilingService, build_for_profile
from kernelforge_tui.store import RunStore, StoreError, resolve_run
from kernelforge_tui.vocabulary.profiles import NodeProfile


async def _profile_kernel(card_path: Path, kernel: Path, plan_path: Path | None) -> NodeProfile:
    """Build one kernel file and profile one launch of it on the card's first input set."""
    settings = load_settings()
    card = load_card(card_path)
    plan = plan_for_kernel(kernel, plan_path)
    return await _profile_source(card, kernel_source(kernel), plan, settings, measured_us=None)


async def _profile_source(
    card: Card, source: str, plan: LaunchPlan, settings: Settings, measured_us: float | None
) -> NodeProfile:
    """Build and profile one kernel on the first GPU through the profiling service the search uses."""
    gpu = require_gpu()[0]
    kernel = await build_for_profile(card, make_builder(settings, gpu.arch), source, plan)
    return await ProfilingService.for_gpu(card, settings.profile, gpu).profile(kernel, measured_us)


def _profile_node(run: str, node_id: int, again: bool, save: bool) -> NodeProfile:
    """A run node's saved profile, or a fresh one (then saved on the node)."""
    recorded = recorded_run(run)
    with RunStore.open(recorded.run_dir, readonly=True) as store:
        saved = store.profile(node_id)
        source, plan = store.node_source(node_id)
        evaluation = store.evaluation(node_id)
        refused = store.read_only_reason
    if saved is not None and not again:
        return saved
    if save and refused is not None:  # said before the GPU work, not after it
        raise StoreError(f"{refused} (or profile it with --no-save)")
    measured = evaluation.result.candidate if evaluation and evaluation.result else None
    card = load_card(recorded.card_dir)
    profiled = asyncio.run(
        _profile_source(card, source, plan, load_settings(), measured.median_us if measured else None)
    )
    if save:
        with RunStore.open(recorded.run_dir) as store:
            store.save_profile(node_id, profiled)
    return profiled


def render_profile(profiled: NodeProfile, console: Console) -> None:
    """The classified report: class and why, the metrics that matter for it, stalls, roofline, overhead."""
    hw, report = profiled.hardware, profiled.profile
    console.print(f"[bold]{escape(hw.kernel)}[/]: [bold cyan]{hw.class_name}[/]  [dim]{escape(hw.reason)}[/]")
    table = Table(title=f"what matters for a {hw.class_name} kernel")
    for column in ("metric", "value", "note"):
        table.add_column(column)
    for metric in hw.key_metrics + hw.stalls:
        label = f"stall: {metric.label}" if metric in hw.stalls else metric.label
        table.add_row(escape(label), escape(metric.value_text()), escape(metric.note))
    console.print(table)
    if hw.roofline is not None:
        r = hw.roofline
        console.print(
            f"roofline: {r.arithmetic_intensity:.3g} FLOP/B (ridge {r.ridge_point:.3g}); {r.achieved_gbps:.0f} GB/s, "
            f"{r.achieved_tflops:.3g} TFLOP/s: [bold]{r.share_of_attainable:.0%}[/] of the {r.bound} roof "
            f"({r.time_source} time)"
        )
    else:
        console.print("[dim]roofline: no measured ceilings for this GPU yet (run `kernelforge eval` once)[/]")
    stats = profiled.ptxas
    if stats is not None:
        console.print(
            f"ptxas: {stats.registers} registers, {stats.shared_bytes} B static shared, "
            f"{stats.spill_store_bytes + stats.spill_load_bytes} B spills"
        )
    console.print(
        f"[dim]ncu {escape(report.ncu_version)}, {len(report.metrics)} metrics, profiled in {report.seconds:.1f} s[/]"
    )
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def _is_run(target: str) -> bool:
    try:
        resolve_run(target)
    except StoreError:
        return False
    return True


def cmd_profile(args: argparse.Namespace, console: Console) -> int:
    if args.what.isdigit():
        profiled = _profile_node(args.target, int(args.what), args.again, not args.no_save)
    elif _is_run(args.target):  # a run's node, named by something that is not a node id
        best = recorded_run(args.target).info.best_node_id
        example = f" (the run's best is node {best})" if best is not None else ""
        raise BadInput(
            f"node {args.what!r} is not a node id: give a number{example}; a kernel file is profiled against a card "
            "directory, not a run"
        )
    else:
        plan = Path(args.plan) if args.plan else None
        profiled = asyncio.run(_profile_kernel(Path(args.target), Path(args.what), plan))
    if args.json:
        print(profiled.model_dump_json(indent=2))
    else:
        render_profile(profiled, console)
    return EXIT_OK
