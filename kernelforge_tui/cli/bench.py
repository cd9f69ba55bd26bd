"""`kernelforge bench`: search the suite's cards (one run each), score them, and write the report.

    kernelforge bench [--tasks GLOB ...] [--precision fp32|bf16|both] [--scales 10,14,18,22]
                      [--proposer templates|agents|hybrid] [--budget-minutes-per-task M] [--budget-iters N]
                      [--gpus N] [-o DIR] [--simulate] [--list] [--report DIR] [--json]

Rerunning the same command on the same DIR continues a bench that was stopped or killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kernelforge_tui.cli.bench_report import md_cell, write_report
from kernelforge_tui.cli.cluster_option import add_cluster_option
from kernelforge_tui.cli.output import EXIT_FAILED, EXIT_OK, fail
from kernelforge_tui.cli.runs import simulate_seconds_from
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.bench import (
    DEFAULT_MINUTES_PER_TASK,
    DONE,
    MANIFEST,
    BenchManifest,
    BenchOptions,
    load_manifest,
    results,
    run_bench,
)
from kernelforge_tui.engine.feedback import cannot_serve
from kernelforge_tui.engine.setup import DEFAULT_PROPOSER, LLM_PROPOSERS, load_proposer
from kernelforge_tui.errors import BadInput
from kernelforge_tui.gpu.detect import detect_gpus
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import select
from kernelforge_tui.suite.score import scale_scores, score_cards, suite_score
from kernelforge_tui.suite.task import PRECISIONS, SHORT, Precision, Task

DEFAULT_OUT = "kernelforge-bench"
PRECISION_CHOICES: dict[str, list[Precision]] = {"fp32": ["float32"], "bf16": ["bfloat16"], "both": list(PRECISIONS)}


def add_bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmark suite: search every task's cards (one run each), score them, write a report",
        description="Search the suite's cards (task x precision x scale), one run each, within a budget per task; "
        "score the speedups (FLOP-weighted), shares of the roofline and the vendor's times; write DIR/report. "
        "Rerun on the same DIR to continue a bench that was stopped or killed.",
    )
    bench.add_argument("--tasks", nargs="+", action="extend", metavar="GLOB", help="task names or globs (all)")
    bench.add_argument("--precision", choices=list(PRECISION_CHOICES), default="both", help="default both")
    bench.add_argument(
        "--scales", nargs="+", action="extend", metavar="LOG2", help="scales as log2 of the elements, e.g. 10,14,18,22"
    )
    bench.add_argument(
        "--proposer",
        choices=[DEFAULT_PROPOSER, *LLM_PROPOSERS],
        default=DEFAULT_PROPOSER,
        help="where candidates come from (default templates: a card no template serves is not searched)",
    )
    bench.add_argument(
        "--budget-minutes-per-task",
        type=float,
        default=DEFAULT_MINUTES_PER_TASK,
        metavar="M",
        help=f"wall minutes per task, shared by its cards (default {DEFAULT_MINUTES_PER_TASK:g})",
    )
    bench.add_argument("--budget-iters", type=int, metavar="N", help="at most N candidates per card")
    bench.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="search up to N cards at once, each on its own GPU (default: every GPU here; 1 with --simulate)",
    )
    add_cluster_option(bench)
    bench.add_argument("-o", "--out", default=DEFAULT_OUT, metavar="DIR", help=f"bench directory (./{DEFAULT_OUT})")
    bench.add_argument(
        "--simulate", action="store_true", help="no GPU: real nvcc builds, INVENTED timings (for trying it and CI)"
    )
    bench.add_argument(
        "--simulate-seconds", type=float, default=0.01, metavar="S", help="simulated GPU seconds per evaluation"
    )
    bench.add_argument(
        "--list", action="store_true", help="list the tasks (family, precisions, scales, check, vendor, template)"
    )
    bench.add_argument(
        "--long",
        action="store_true",
        help="with --list: each task in full (its check, vendor, and why no template serves it), not one line each",
    )
    bench.add_argument(
        "--markdown", action="store_true", help="with --list: the task table in Markdown (as README.md holds it)"
    )
    bench.add_argument("--report", metavar="DIR", help="rewrite DIR/report from DIR's manifest; run nothing")
    bench.add_argument("--json", action="store_true", help="no live view; print results.json at the end")


def parse_scales(values: list[str] | None) -> list[int]:
    """`--scales 10,14 18`: log2 exponents, as element counts; BadInput for anything else."""
    scales: list[int] = []
    for value in values or []:
        for part in filter(None, value.split(",")):
            try:
                log2 = int(part)
            except ValueError:
                raise BadInput(f"--scales {part!r}: give log2 exponents such as 10,14,18,22") from None
            if not 10 <= log2 <= 22:
                raise BadInput(f"--scales {log2}: the suite's scales are 2^10 to 2^22 elements")
            scales.append(2**log2)
    return sorted(set(scales))


def options_from(args: argparse.Namespace) -> BenchOptions:
    minutes = args.budget_minutes_per_task
    if not (math.isfinite(minutes) and minutes >= 0):
        raise BadInput(f"--budget-minutes-per-task {minutes}: give 0 or more minutes")
    if args.budget_iters is not None and args.budget_iters < 0:
        raise BadInput(f"--budget-iters {args.budget_iters}: give 0 or more candidates")
    if args.gpus is not None and args.gpus < 1:
        raise BadInput(f"--gpus {args.gpus}: give 1 or more GPUs")
    return BenchOptions(
        tasks=args.tasks or [],
        precisions=PRECISION_CHOICES[args.precision],
        scales=parse_scales(args.scales),
        proposer=args.proposer,
        minutes_per_task=minutes,
        iterations=args.budget_iters,
        simulate=args.simulate,
        simulate_seconds=simulate_seconds_from(args),
        max_gpus=args.gpus,
        cluster=args.cluster,
    )


def template_note(task: Task, precision: Precision) -> str:
    """ "template" or "no template: why" for the task's smallest card at that precision."""
    spec = suite_cards.spec(task, precision, min(task.scales))
    why = cannot_serve(load_proposer(DEFAULT_PROPOSER), spec)
    return "template" if why is None else f"no template: the templates proposer {why}"


class TaskListing(BaseModel):
    """One task as `--list` shows it."""

    task: str
    family: str
    precisions: list[str]
    no_bf16: str
    scales: list[int]
    """log2 of the elements of the main tensor."""
    check: str
    vendor: str | None
    template: str
    """"template", or "no template: why" (per precision where they differ)."""


def list_tasks(tasks: list[Task]) -> list[TaskListing]:
    return [
        TaskListing(
            task=t.name,
            family=t.family,
            precisions=[SHORT[p] for p in t.precisions],
            no_bf16=t.no_bf16,
            scales=[s.bit_length() - 1 for s in t.scales],
            check=t.check,
            vendor=t.vendor.library if t.vendor else None,
            template="; ".join(dict.fromkeys(template_note(t, p) for p in t.precisions)),
        )
        for t in tasks
    ]


def markdown_table(rows: list[TaskListing]) -> str:
    """The suite's task table as README.md holds it (a test keeps the two equal)."""
    lines = ["| task | family | precisions | check | vendor |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        precisions = ", ".join(r.precisions) + (f" (no bf16: {r.no_bf16})" if r.no_bf16 else "")
        cells = (r.task, r.family, precisions, r.check, r.vendor or "-")
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _print_list(rows: list[TaskListing], console: Console, long: bool) -> None:
    """One line a task (the names `--tasks` takes, at a glance: no line wraps at 80 columns), or with `long` each
    task in full, wrapped at words; first, for a machine without a GPU, the command that tries the bench anyway."""
    if not detect_gpus():
        task = escape(rows[0].task if rows else "vector_add")
        console.print(
            f"[yellow]no GPU here?[/] [bold]kernelforge bench --simulate --tasks {task}[/]: invented timings",
            soft_wrap=True,
        )
    console.print(f"[bold]kernelforge bench: {len(rows)} task{'s' * (len(rows) != 1)}[/]")
    if long:
        for r in rows:
            precisions = ", ".join(r.precisions) + (f" (no bf16: {r.no_bf16})" if r.no_bf16 else "")
            scales = ", ".join(f"2^{s}" for s in r.scales)
            console.print(f"\n[bold]{escape(r.task)}[/] ({r.family}): {escape(precisions)}; scales {scales}")
            console.print(f"  check: {escape(r.check)}")
            console.print(f"  vendor: {escape(r.vendor or '-')}")
            template = escape(r.template) if r.template == "template" else f"[yellow]{escape(r.template)}[/]"
            console.print(f"  template: {template}")
        return
    table = Table.grid(padding=(0, 2))
    for column in ("task", "family", "precisions", "scales (log2)", "template"):
        table.add_column(column, no_wrap=True)
    table.add_row(*(f"[dim]{c}[/]" for c in ("task", "family", "precisions", "scales (log2)", "proposer")))
    for r in rows:
        table.add_row(
            escape(r.task),
            r.family,
            " ".join(r.precisions),
            ",".join(str(s) for s in r.scales),
            "template" if r.template == "template" else "[yellow]none[/]",
        )
    console.print(table)
    console.print("[dim]--long: each task's check, vendor, and why no template serves it[/]")


def render_progress(manifest: BenchManifest, last: str) -> Group:
    """The live view: cards and tasks done, the cards in progress and their GPUs, each task's best per card, the
    minutes left (and the wall time they take over the bench's GPUs)."""
    cards = manifest.cards
    tasks = list(dict.fromkeys(c.task for c in cards))
    tasks_done = sum(all(c.state in DONE for c in manifest.task_cards(t)) for t in tasks)
    running = [
        f"[bold]{escape(c.card)}[/]" + ("" if c.gpu is None else f" on GPU {c.gpu}")
        for c in cards
        if c.state == "running"
    ]
    left = manifest.minutes_left()
    budget = ""
    if left is not None:
        budget = f"; at most {left:.1f} min of budget left"
        if manifest.gpus > 1:
            budget += f" (~{left / manifest.gpus:.1f} min of wall time on {manifest.gpus} GPUs)"
    head = Text.from_markup(
        ("[yellow bold]SIMULATED[/] " if manifest.simulated else "")
        + f"cards {sum(c.state in DONE for c in cards)}/{len(cards)}, tasks {tasks_done}/{len(tasks)}; "
        + f"now {', '.join(running) or '-'}"
        + budget
    )
    table = Table(box=None, padding=(0, 2))
    for column in ("task", "done", "best per card"):
        table.add_column(column)
    for name in tasks:
        mine = manifest.task_cards(name)
        bests = []
        for c in mine:
            label = f"{SHORT[c.precision]} s{c.log2_scale}"
            if c.state == "no-template":
                bests.append(f"{label} [yellow]no template[/]")
            elif c.best_speedup is not None:
                bests.append(f"{label} {c.best_speedup:.2f}x")
            elif c.state in ("failed", "not-run", "running"):
                bests.append(f"{label} {c.state}")
        done = sum(c.state in DONE for c in mine)
        table.add_row(escape(name), f"{done}/{len(mine)}", "  ".join(bests))
    return Group(head, table, Text(last, style="dim"))


def _summary(manifest: BenchManifest) -> str:
    rows = score_cards(results(manifest))
    score = suite_score(rows)
    per_scale = ", ".join(f"2^{s.bit_length() - 1} {v:.3f}x" for s, v in scale_scores(rows).items())
    label = "SIMULATED suite score" if manifest.simulated else "suite score"
    shown = "-" if score is None else f"{score:.3f}x"
    return f"{label}: {shown}" + (f" (by scale: {per_scale})" if per_scale else "")


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    if args.list:
        try:
            tasks = select(args.tasks or [])
        except KeyError as exc:
            raise BadInput(str(exc.args[0])) from None
        rows = list_tasks(tasks)
        if args.markdown:
            print(markdown_table(rows))
        elif args.json:
            print(json.dumps([r.model_dump() for r in rows], indent=2))
        else:
            _print_list(rows, console, args.long)
        return EXIT_OK
    if args.report:
        out = Path(args.report)
        manifest = load_manifest(out)
        return _finish(manifest, write_report(manifest, out), args, console)
    out = Path(args.out)
    options = options_from(args)
    try:
        manifest = asyncio.run(_run(out, options, args, console))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C: the card in progress stays resumable
        return fail(
            console, args.json, "interrupted", f"interrupted: rerun the same command to continue {out}", EXIT_FAILED
        )
    return _finish(manifest, write_report(manifest, out), args, console)


async def _run(out: Path, options: BenchOptions, args: argparse.Namespace, console: Console) -> BenchManifest:
    settings = load_settings()
    if args.json:
        return await run_bench(out, settings, options)
    if not console.is_terminal:  # a log: one line per event

        def line(manifest: BenchManifest, text: str) -> None:
            console.print(escape(text), soft_wrap=True)

        return await run_bench(out, settings, options, line)
    with Live(Text("starting the bench"), console=console, refresh_per_second=4) as live:

        def update(manifest: BenchManifest, text: str) -> None:
            live.update(render_progress(manifest, text))

        return await run_bench(out, settings, options, update)


def _finish(manifest: BenchManifest, report: Path, args: argparse.Namespace, console: Console) -> int:
    if args.json:
        print((report / "results.json").read_text(), end="")
        return EXIT_OK
    console.print(f"[bold]{escape(_summary(manifest))}[/]")
    console.print(f"report: {escape(str(report / 'report.md'))} (manifest {escape(str(report.parent / MANIFEST))})")
    return EXIT_OK
