"""`kernelforge optimize`, `runs`, `tui` and `open`: start, resume, list and watch searches."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.cli.output import EXIT_FAILED, EXIT_OK, fail
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.backend import SIMULATED
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.search import Search
from kernelforge_tui.engine.setup import RunOptions, prepare_run
from kernelforge_tui.engine.tree import TreeSettings
from kernelforge_tui.engine.view import RunView
from kernelforge_tui.errors import BadInput
from kernelforge_tui.models.commands import Stop
from kernelforge_tui.models.evaluation import speedup_text
from kernelforge_tui.models.events import EngineEvent
from kernelforge_tui.models.runs import RunInfo
from kernelforge_tui.store import list_runs, runs_root


def render_run(info: RunInfo, live: RunView | None = None) -> Table:
    """The run at a glance: best speedup, share of the ceiling, nodes, failures, throughput, GPU use."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    simulated = info.backend == SIMULATED
    table.add_row("run", f"{escape(info.run_id)}  [dim]{escape(str(info.run_dir))}[/]")
    table.add_row("card", f"{escape(info.card_name)} ({info.family})")
    table.add_row(
        "backend",
        "[yellow bold]SIMULATED: timings are invented, no GPU ran anything[/]" if simulated else escape(info.gpu_name),
    )
    table.add_row("state", f"{info.state}" + (f"  [dim]{escape(info.reason)}[/]" if info.reason else ""))
    if info.best_speedup is not None:
        label = "best (simulated)" if simulated else "best"
        best = speedup_text(info.best_speedup, info.best_speedup_interval, 3)
        table.add_row(
            label,
            f"[green bold]{best}[/] over the card's baseline, node "
            f"{info.best_node_id}, {info.best_latency_us or 0:.4g} us",
        )
        if info.best_ceiling_share is not None:
            ceiling = "the simulated ceiling" if simulated else "the measured ceiling"
            table.add_row("ceiling", f"{info.best_ceiling_share:.0%} of {ceiling}")
    table.add_row("nodes", f"{info.node_count} ({info.in_flight_count} in flight, {info.failure_count} failed)")
    budget = live.budget if live else None
    if budget is not None:
        caps = [
            f"{budget.iterations}"
            + (f"/{budget.max_iterations}" if budget.max_iterations is not None else "")
            + " candidates",
            f"{budget.elapsed_s / 60:.1f}" + (f"/{budget.max_seconds / 60:g}" if budget.max_seconds else "") + " min",
            f"{budget.gpu_seconds:.1f}" + (f"/{budget.max_gpu_seconds:g}" if budget.max_gpu_seconds else "") + " GPU s",
        ]
        table.add_row("budget", ", ".join(caps))
        table.add_row(
            "rate",
            f"{budget.candidates_per_minute:.1f} candidates/min, GPU busy "
            f"{budget.gpu_busy_share:.0%}" + (" (simulated)" if simulated else ""),
        )
    for line in live.recent_logs(4) if live is not None else ():
        node = f"#{line.node_id} " if line.node_id is not None else ""
        first = line.text.split("\n", 1)[0]  # a compiler error's first line; the TUI's log keeps the rest
        table.add_row("", f"[dim]{escape(node + first)}[/]")
    return table


def _tree_overrides(pairs: list[str]) -> dict[str, str]:
    """`--tree exploration=0.7` pairs; the run set-up checks them against TreeSettings."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            fields = ", ".join(sorted(TreeSettings.model_fields))
            raise BadInput(f"--tree {pair!r}: use KEY=VALUE with KEY one of {fields}")
        overrides[key] = value
    return overrides


async def _optimize(args: argparse.Namespace, console: Console) -> RunInfo:
    budget = Budget(
        max_iterations=args.budget_iters, max_minutes=args.budget_minutes, max_gpu_seconds=args.budget_gpu_seconds
    )
    options = RunOptions(
        resume=args.resume,
        run_dir=Path(args.run_dir) if args.run_dir else None,
        root=Path(args.root) if args.root else None,
        budget=budget,
        tree=_tree_overrides(args.tree or []),
        proposer=args.proposer,
        strategy=args.strategy,
        simulate=args.simulate,
        simulate_seconds=args.simulate_seconds,
    )
    search = prepare_run(Path(args.card) if args.card else None, load_settings(), options)
    try:
        return await _drive(search, console, quiet=args.json)
    finally:
        search.store.close()


async def _drive(search: Search, console: Console, quiet: bool) -> RunInfo:
    """Run the search under a live view; the first Ctrl-C (or SIGTERM) stops it cleanly, the second at once."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(search.run())
    signals = 0
    pending: set[asyncio.Task[None]] = set()

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            stop = loop.create_task(search.send(Stop()))
            pending.add(stop)
            stop.add_done_callback(pending.discard)
        else:
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    queue = search.subscribe()
    state = RunView()
    try:
        if quiet:
            return await task
        with Live(render_run(search.store.run_info(), state), console=console, refresh_per_second=4) as live:
            while not task.done():
                batch: list[EngineEvent] = []
                with contextlib.suppress(TimeoutError):
                    batch.append(await asyncio.wait_for(queue.get(), 0.25))
                while not queue.empty():
                    batch.append(queue.get_nowait())
                state.apply(batch)
                live.update(render_run(search.store.run_info(), state))
            info = await task
            live.update(render_run(info, state))
            return info
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def cmd_optimize(args: argparse.Namespace, console: Console) -> int:
    """A baseline that fails ends the command through BaselineFailed (exit code 1), like any typed error."""
    try:
        info = asyncio.run(_optimize(args, console))
    except asyncio.CancelledError:  # a second Ctrl-C: the run is left as it was, resumable
        return fail(console, args.json, "interrupted", "interrupted: resume the run with --resume", EXIT_FAILED)
    if args.json:
        print(info.model_dump_json(indent=2))
    else:
        console.print()
        console.print(f"resume or extend it with: kernelforge optimize --resume {escape(str(info.run_dir))}")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, console: Console) -> int:
    listing = list_runs(Path(args.root) if args.root else None)
    for skipped in listing.skipped:  # on stderr: --json output stays a list of runs
        print(f"note: skipped {skipped.run_dir}: {skipped.reason}", file=sys.stderr)
    infos = listing.runs
    if args.json:
        print(json.dumps([i.model_dump(mode="json") for i in infos], indent=2))
        return EXIT_OK
    if not infos:
        console.print(f"no runs under {escape(str(Path(args.root) if args.root else runs_root()))}")
        return EXIT_OK
    table = Table(title="kernelforge runs")
    for column in ("run", "card", "backend", "state", "best", "ceiling", "nodes", "failed", "started"):
        table.add_column(column)
    for i in infos:
        best = f"{i.best_speedup:.3g}x (node {i.best_node_id})" if i.best_speedup is not None else "-"
        ceiling = f"{i.best_ceiling_share:.0%}" if i.best_ceiling_share is not None else "-"
        backend = "[yellow]simulated[/]" if i.backend == SIMULATED else escape(i.gpu_name)
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(i.started_at))
        table.add_row(
            escape(i.run_id),
            escape(i.card_name),
            backend,
            i.state,
            best,
            ceiling,
            str(i.node_count),
            str(i.failure_count),
            started,
        )
    console.print(table)
    return EXIT_OK


def cmd_tui(args: argparse.Namespace, console: Console) -> int:
    from kernelforge_tui.tui.launch import run_tui

    run_dir = run_tui(
        Path(args.card),
        theme=args.theme,
        budget_iters=args.budget_iters,
        budget_minutes=args.budget_minutes,
        simulate=args.simulate,
    )
    if run_dir:
        console.print(f"run stored in {escape(run_dir)}: `kernelforge open` it, or resume it with `optimize --resume`")
    return EXIT_OK


def cmd_open(args: argparse.Namespace, console: Console) -> int:
    from kernelforge_tui.tui.launch import open_run

    open_run(args.run, theme=args.theme)
    return EXIT_OK
