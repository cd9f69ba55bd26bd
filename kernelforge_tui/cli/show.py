"""`kernelforge show RUN [NODE|best]`: take a kernel away from a run (source, plan, summary) with the run's chart."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from kernelforge_tui.cli.chart import write_chart
from kernelforge_tui.cli.output import EXIT_OK
from kernelforge_tui.engine.takeaway import (
    KERNEL_FILE,
    PLAN_FILE,
    SUMMARY_FILE,
    default_out_dir,
    progress,
    render_summary,
    summarize,
    write_kernel,
)
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import RunStore, resolve_run

CHART_FILE = "progress.png"


def add_show_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    show = sub.add_parser(
        "show",
        help="take a kernel away from a run: kernel.cu, plan.toml, summary.md and a progress chart",
        description="Write a run node's kernel.cu, its plan.toml (kernelforge eval CARD kernel.cu --plan plan.toml "
        "runs it again) and summary.md (speedup with its interval, ceiling share, GPU, checks passed, the reward "
        "explained, where it came from), with progress.png: the run's fastest speedup and best share of the ceiling "
        "over its candidates. Prints the summary.",
    )
    show.add_argument("run", help="run directory or run id")
    show.add_argument("node", nargs="?", default="best", help="the node id, or 'best' (the default): the run's best")
    show.add_argument("-o", "--out", metavar="DIR", help="where the files go (default: ./RUN-node-N)")
    show.add_argument("--root", metavar="DIR", help="runs root for a run id (default: the data dir's runs/)")
    show.add_argument("--json", action="store_true", help="print the summary and the files written as JSON")


def node_id(text: str, store: RunStore) -> int:
    """`best` (the run's promoted best) or a node id; BadInput naming what is wrong otherwise."""
    if text == "best":
        best = store.run_info().best_node_id
        if best is None:
            raise BadInput(f"run {store.run_dir.name} has no measured node yet: give a node id, or wait for one")
        return best
    if not text.isdigit():
        raise BadInput(f"node {text!r} is not a node id: give a number (the TUI shows each node's) or 'best'")
    return int(text)


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    with RunStore.open(resolve_run(args.run, Path(args.root) if args.root else None), readonly=True) as store:
        node = node_id(args.node, store)
        summary = summarize(store, node)  # an unknown node fails here, before a directory is made
        out = write_kernel(store, node, Path(args.out) if args.out else default_out_dir(store.run_info(), node))
        info = store.run_info()
        points = progress(store)
    files = [out / KERNEL_FILE, out / PLAN_FILE, out / SUMMARY_FILE]
    if points:
        title = f"{info.card_name}: run {info.run_id}" + (" (SIMULATED timings)" if summary.simulated else "")
        files.append(write_chart(points, title, out / CHART_FILE))
    if args.json:
        print(json.dumps({**summary.model_dump(mode="json"), "files": [str(f) for f in files]}, indent=2))
        return EXIT_OK
    print(render_summary(summary))
    console.print(f"wrote {', '.join(str(f) for f in files)}", highlight=False, markup=False, soft_wrap=True)
    return EXIT_OK
