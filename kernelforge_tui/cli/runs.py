"""`kernelforge optimize`, `runs`, `tui` and `open`: start, resume, list and watch searches."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.capture.manifest import is_capture_dir
from kernelforge_tui.cli.output import EXIT_FAILED, EXIT_OK, fail, fitted_table
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.backend import SIMULATED
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.search import Search
from kernelforge_tui.engine.setup import RunOptions, prepare_run, stored_resume_command
from kernelforge_tui.engine.tree import TreeSettings
from kernelforge_tui.engine.view import RunView
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import RunStore, StoreError, copy_run, list_runs, resolve_run, runs_root
from kernelforge_tui.vocabulary.commands import Stop
from kernelforge_tui.vocabulary.evaluation import speedup_text
from kernelforge_tui.vocabulary.events import EngineEvent
from kernelforge_tui.vocabulary.llm import LlmTotals, ModelRecord, usd
from kernelforge_tui.vocabulary.runs import RunInfo


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
        if budget.tokens or budget.max_tokens is not None or budget.max_money_usd is not None:
            table.add_row(
                "llm",
                f"${budget.money_usd:.4f}"
                + (f"/${budget.max_money_usd:g}" if budget.max_money_usd is not None else "")
                + f", {budget.tokens}"
                + (f"/{budget.max_tokens}" if budget.max_tokens is not None else "")
                + " tokens",
            )
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


BUDGET_OPTIONS = {
    "max_iterations": "--budget-iters",
    "max_minutes": "--budget-minutes",
    "max_gpu_seconds": "--budget-gpu-seconds",
    "max_money": "--budget-money",
    "max_tokens": "--budget-tokens",
}


def budget_from(args: argparse.Namespace) -> Budget:
    """The caps given on the command line; a negative or non-finite one is bad input naming its option."""
    values = {
        "max_iterations": args.budget_iters,
        "max_minutes": args.budget_minutes,
        "max_gpu_seconds": getattr(args, "budget_gpu_seconds", None),
        "max_money": args.budget_money,
        "max_tokens": args.budget_tokens,
    }
    for field, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise BadInput(f"{BUDGET_OPTIONS[field]} {value}: give a finite number")
    try:
        return Budget(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        option = BUDGET_OPTIONS.get(str(first["loc"][0]), str(first["loc"][0]))
        raise BadInput(f"{option} {first['input']}: {first['msg'].lower()}: give a cap of 0 or more") from None


def simulate_seconds_from(args: argparse.Namespace) -> float:
    """`--simulate-seconds`: finite and 0 or more (a negative one would count GPU time backwards)."""
    seconds: float = args.simulate_seconds
    if not (math.isfinite(seconds) and seconds >= 0):
        raise BadInput(f"--simulate-seconds {seconds}: give 0 or more simulated GPU seconds per evaluation")
    return seconds


async def _optimize(args: argparse.Namespace, console: Console) -> RunInfo:
    budget = budget_from(args)
    options = RunOptions(
        resume=args.resume,
        run_dir=Path(args.run_dir) if args.run_dir else None,
        root=Path(args.root) if args.root else None,
        budget=budget,
        tree=_tree_overrides(args.tree or []),
        proposer=args.proposer,
        strategy=args.strategy,
        simulate=args.simulate,
        simulate_seconds=simulate_seconds_from(args),
        cluster=args.cluster,
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
                    async with asyncio.timeout(0.25):
                        batch.append(await queue.get())
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
    if args.card and not args.resume and is_capture_dir(Path(args.card)):  # a capture: one search per variant
        from kernelforge_tui.cli.capture import cmd_optimize_capture

        return cmd_optimize_capture(args, console)
    try:
        info = asyncio.run(_optimize(args, console))
    except asyncio.CancelledError:  # a second Ctrl-C: the run is left as it was, resumable
        return fail(console, args.json, "interrupted", "interrupted: resume the run with --resume", EXIT_FAILED)
    if args.json:
        print(info.model_dump_json(indent=2))
    else:
        console.print()
        console.print(f"resume or extend it with: {escape(stored_resume_command(info.run_dir))}", soft_wrap=True)
    return EXIT_OK


@dataclass
class StoredExtras:
    """What `runs` reads from a run's store beyond its run row."""

    llm: LlmTotals | None
    """Its LLM use; None when it made no call, or its store cannot be read now."""
    measured_on: dict[str, int]
    """Evaluations per GPU that measured them (`RunStore.measured_on`); empty for old runs."""


def _stored_extras(run_dir: Path) -> StoredExtras:
    try:
        with RunStore.open(run_dir, readonly=True) as store:
            totals, measured_on = store.llm_totals(), store.measured_on()
    except StoreError:
        return StoredExtras(None, {})
    return StoredExtras(totals if totals.calls else None, measured_on)


def gpus_text(measured_on: dict[str, int]) -> str:
    """The listing's GPUs column: how many GPUs measured the run's candidates, "-" where none is recorded."""
    return str(len(measured_on)) if measured_on else "-"


def cmd_runs(args: argparse.Namespace, console: Console) -> int:
    if args.runs_command == "copy":
        return _copy(args, console)
    listing = list_runs(Path(args.root) if args.root else None)
    for skipped in listing.skipped:  # on stderr: --json output stays a list of runs
        print(f"note: skipped {skipped.run_dir}: {skipped.reason}", file=sys.stderr)
    infos = listing.runs
    if args.models:
        return _models(infos, args, console)
    extras = {i.run_dir: _stored_extras(i.run_dir) for i in infos}
    llm = {run_dir: found.llm for run_dir, found in extras.items()}
    if args.json:
        rows = []
        for i in infos:
            row = i.model_dump(mode="json")
            totals = llm[i.run_dir]
            row["llm"] = None if totals is None else {**totals.model_dump(), "cost_usd": totals.cost_usd}
            row["measured_on"] = extras[i.run_dir].measured_on
            rows.append(row)
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not infos:
        console.print(f"no runs under {escape(str(Path(args.root) if args.root else runs_root()))}")
        return EXIT_OK
    with_llm = any(totals is not None for totals in llm.values())
    columns: dict[str, list[str]] = {"run": [], "card": [], "backend": [], "GPUs": [], "state": [], "best": []}
    columns |= {"ceiling": [], "nodes": [], "failed": [], **({"llm": []} if with_llm else {}), "started": []}
    for i in infos:
        totals = llm[i.run_dir]
        cells = {
            "run": escape(i.run_id),
            "card": escape(i.card_name),
            "backend": "[yellow]simulated[/]" if i.backend == SIMULATED else escape(i.gpu_name),
            "GPUs": gpus_text(extras[i.run_dir].measured_on),
            "state": i.state,
            "best": f"{i.best_speedup:.3g}x (node {i.best_node_id})" if i.best_speedup is not None else "-",
            "ceiling": f"{i.best_ceiling_share:.0%}" if i.best_ceiling_share is not None else "-",
            "nodes": str(i.node_count),
            "failed": str(i.failure_count),
            "llm": "-"
            if totals is None
            else f"${totals.cost_usd:.4f} ({totals.calls} call{'s' * (totals.calls != 1)})",
            "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(i.started_at)),
        }
        for name, cells_of in columns.items():
            cells_of.append(cells[name])
    table, left_out = fitted_table("kernelforge runs", columns, RUNS_DROPPED_FIRST, console)
    console.print(table)
    if left_out:
        console.print(f"[dim]left out at this width: {', '.join(left_out)} (a wider terminal, or --json, has them)[/]")
    return EXIT_OK


def _copy(args: argparse.Namespace, console: Console) -> int:
    dest = copy_run(resolve_run(args.src, Path(args.root) if args.root else None), Path(args.dest))
    if args.json:
        print(json.dumps({"ok": True, "run_dir": str(dest)}))
    else:
        console.print(
            f"copied to {escape(str(dest))}: steer it with `kernelforge open {escape(str(dest))}`, or continue it "
            f"with `{escape(stored_resume_command(dest))}`",
            soft_wrap=True,
        )
    return EXIT_OK


RUNS_DROPPED_FIRST = ("GPUs", "ceiling", "failed", "llm", "started", "nodes", "backend", "card", "state", "best")
"""The listing's columns in the order a narrow terminal leaves them out; the run's name is always shown whole."""


@dataclass
class ModelRow:
    """One provider/model on one card, summed over the runs under the root (simulated runs apart: their speedups
    are invented, and none of their kernels was proven correct on a GPU, so they count none as correct)."""

    card: str
    family: str
    provider: str
    model: str
    simulated: bool
    runs: int = 0
    calls: int = 0
    kernels: int = 0
    correct: int = 0
    best_speedup: float | None = None
    cost_nanousd: int = 0

    def add(self, record: ModelRecord) -> None:
        self.runs += 1
        self.calls += record.calls
        self.kernels += record.kernels
        self.correct += record.correct
        self.cost_nanousd += record.cost_nanousd
        if record.best_speedup is not None:
            self.best_speedup = max(self.best_speedup or 0.0, record.best_speedup)

    @property
    def proven(self) -> int | None:
        """Kernels proven correct on a GPU; None for simulated runs, which prove nothing."""
        return None if self.simulated else self.correct

    @property
    def success_rate(self) -> float | None:
        return self.correct / self.kernels if self.kernels and not self.simulated else None

    def as_json(self) -> dict[str, object]:
        return {
            "card": self.card,
            "family": self.family,
            "provider": self.provider,
            "model": self.model,
            "simulated": self.simulated,
            "runs": self.runs,
            "calls": self.calls,
            "kernels": self.kernels,
            "correct": self.proven,
            "success_rate": self.success_rate,
            "best_speedup": self.best_speedup,
            "cost_usd": usd(self.cost_nanousd),
        }


def model_rows(infos: list[RunInfo]) -> list[ModelRow]:
    """Per card and per provider/model: what the models' calls did across the runs, best first on each card."""
    rows: dict[tuple[str, str, str, bool], ModelRow] = {}
    for info in infos:
        try:
            with RunStore.open(info.run_dir, readonly=True) as store:
                records = store.model_records()
        except StoreError as exc:
            print(f"note: skipped {info.run_dir}: {exc}", file=sys.stderr)
            continue
        simulated = info.backend == SIMULATED
        for r in records:
            key = (r.card, r.provider, r.model, simulated)
            row = rows.setdefault(key, ModelRow(r.card, r.family, r.provider, r.model, simulated))
            row.add(r)
    return sorted(
        rows.values(),
        key=lambda r: (r.card, r.simulated, -(r.best_speedup or 0.0), -(r.success_rate or 0.0), r.provider, r.model),
    )


def _models(infos: list[RunInfo], args: argparse.Namespace, console: Console) -> int:
    rows = model_rows(infos)
    if args.json:
        print(json.dumps([r.as_json() for r in rows], indent=2))
        return EXIT_OK
    if not rows:
        where = Path(args.root) if args.root else runs_root()
        console.print(f"no LLM calls recorded in the runs under {escape(str(where))}")
        return EXIT_OK
    for card in sorted({r.card for r in rows}):
        mine = [r for r in rows if r.card == card]
        table = Table(title=f"{card} ({mine[0].family}): models compared")
        for column in ("provider", "model", "runs", "calls", "kernels", "correct", "success", "best", "cost"):
            table.add_column(column)
        for r in mine:
            best = "-" if r.best_speedup is None else f"{r.best_speedup:.3g}x" + (" (simulated)" * r.simulated)
            table.add_row(
                escape(r.provider),
                escape(r.model),
                str(r.runs),
                str(r.calls),
                str(r.kernels),
                "-" if r.proven is None else str(r.proven),
                "-" if r.success_rate is None else f"{r.success_rate:.0%}",
                best,
                f"${usd(r.cost_nanousd):.4f}",
            )
        console.print(table)
    if any(r.simulated for r in rows):
        console.print("simulated runs prove no kernel correct on a GPU: their correct and success columns are empty")
    return EXIT_OK


def cmd_tui(args: argparse.Namespace, console: Console) -> int:
    from kernelforge_tui.tui.launch import run_tui

    note = run_tui(
        Path(args.card),
        budget_from(args),
        theme=args.theme,
        proposer=args.proposer,
        simulate=args.simulate,
        simulate_seconds=simulate_seconds_from(args),
        cluster=args.cluster,
    )
    console.print(escape(note), soft_wrap=True)
    return EXIT_OK


def cmd_open(args: argparse.Namespace, console: Console) -> int:
    """View or follow a run; `--resume` continues one that is over, here. A run that is over closes with the line
    saying how to continue it."""
    from kernelforge_tui.tui.launch import open_run

    note = open_run(
        args.run,
        theme=args.theme,
        resume=args.resume,
        budget=budget_from(args),
        simulate=args.simulate,
        simulate_seconds=simulate_seconds_from(args),
        cluster=args.cluster,
    )
    if note:
        console.print(escape(note), soft_wrap=True)
    return EXIT_OK
