"""`kernelforge capture` (and `--show`), and `kernelforge optimize` on a capture directory.

Nothing here imports torch: `capture.run` loads the recorder (and torch) only when a capture runs, and says how to
install torch when it is missing, so every other command works without it.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.capture.manifest import CaptureManifest, Json, Variant, load_capture
from kernelforge_tui.cards.directory import MAX_STORED_SET_BYTES
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cli.output import EXIT_FAILED, EXIT_OK, fail
from kernelforge_tui.config import CaptureSettings, load_settings
from kernelforge_tui.engine.capture_search import (
    REPORT,
    CaptureOptimizeOptions,
    CaptureOptimizeReport,
    optimize_capture,
)
from kernelforge_tui.errors import BadInput, install_fix

SHOW_UNSUPPORTED = 12
"""Rows of variants without a card that --show lists (largest share first); the rest are summed in one line."""
EXIT_INTERRUPTED = 130
"""128 + SIGINT: what a shell reports for a command stopped by Ctrl-C."""


def add_capture_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cap = sub.add_parser(
        "capture",
        help="run a PyTorch model, record its aten calls as ranked variants, and make a card for each it can optimise",
        description="Import MODEL_FILE, build the model and its example inputs with the entry function, run it under "
        "a dispatch hook that records every aten call, group the calls into variants (same overload, same shapes, "
        "strides, dtypes and scalar arguments), time them, rank them by the time a faster kernel could save, and "
        "write a capture directory: capture.json plus one operator card per variant the product can optimise. "
        f"Needs torch ({install_fix('torch')}).",
    )
    cap.add_argument("model", nargs="?", help="the Python file that builds the model and its example inputs")
    cap.add_argument(
        "--entry",
        default="build",
        metavar="FN[:FN]",
        help="build (default): a function returning (model, example_inputs); or MAKE_MODEL:MAKE_INPUTS, two functions",
    )
    cap.add_argument(
        "--kwarg",
        action="append",
        metavar="NAME=VALUE",
        help="a keyword argument for the entry function(s) that declare it (VALUE read as a Python literal, else a "
        "string), e.g. --kwarg size=small; device is always offered",
    )
    cap.add_argument("-o", "--out", metavar="DIR", help="the capture directory to write (default: ./MODEL.capture)")
    cap.add_argument("--device", choices=["cuda", "cpu"], help="where the model runs (default: cuda if torch sees one)")
    cap.add_argument("--samples", type=int, default=2, metavar="N", help="calls stored per card as input sets (2)")
    cap.add_argument("--repeats", type=int, default=5, metavar="N", help="forward passes timed (5)")
    cap.add_argument(
        "--max-set-mib",
        type=float,
        default=MAX_STORED_SET_BYTES / 2**20,
        metavar="MIB",
        help=f"store a sampled call as a card's input set only up to this size ({MAX_STORED_SET_BYTES >> 20}); larger "
        "cards draw seeded sets",
    )
    cap.add_argument("--force", action="store_true", help="replace the output directory if it exists")
    cap.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop the capture when the model's import, build and passes take longer in all (default: timeout_s of "
        f"the config file's [capture] table, {CaptureSettings.model_fields['timeout_s'].default:g})",
    )
    cap.add_argument("--show", metavar="DIR", help="print a capture directory's ranked table and exit")
    cap.add_argument("--json", action="store_true", help="machine-readable output (the manifest)")


def parse_kwargs(pairs: list[str] | None) -> dict[str, Json]:
    values: dict[str, Json] = {}
    for pair in pairs or []:
        name, sep, text = pair.partition("=")
        if not sep or not name.isidentifier():
            raise BadInput(f"--kwarg {pair!r}: write NAME=VALUE, e.g. --kwarg size=small")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if not isinstance(value, (str, int, float, bool, list)) and value is not None:
            raise BadInput(f"--kwarg {pair!r}: give a number, a string, a boolean, None or a list")
        values[name] = value
    return values


def template_problem(card: OperatorCard) -> str | None:
    """Why the built-in template proposer cannot serve a card (None when it can)."""
    from kernelforge_tui.proposers.templates.proposer import TEMPLATES, template_for

    if template_for(card) is not None:
        return None
    reasons = [f"{t.name}: {t.unsupported(card)}" for t in TEMPLATES if card.family in t.families]
    if reasons:  # each of the family's templates says why: a naming mismatch of one may hide what another lacks
        return f"no {card.family} template can serve it ({'; '.join(reasons)})"
    return f"the template library has no {card.family} family (an LLM proposer can serve the card)"


def cmd_capture(args: argparse.Namespace, console: Console) -> int:
    if args.show:
        manifest = load_capture(Path(args.show))
        if args.json:
            print(manifest.model_dump_json(indent=1))
        else:
            render_capture(manifest, Path(args.show), console)
        return EXIT_OK
    if not args.model:
        raise BadInput("give MODEL_FILE to capture, or --show DIR")
    from kernelforge_tui.capture.run import CaptureInterrupted, CaptureRequest, capture_model, default_out

    model = Path(args.model)
    out = Path(args.out) if args.out else default_out(model)
    request = CaptureRequest(
        model_file=model,
        out=out,
        entry=args.entry,
        kwargs=parse_kwargs(args.kwarg),
        device=args.device,
        samples=args.samples,
        repeats=args.repeats,
        force=args.force,
        max_set_bytes=int(args.max_set_mib * 2**20),
        timeout_s=load_settings().capture.timeout_s if args.timeout is None else args.timeout,
    )
    quiet = args.json

    def say(line: str) -> None:
        if not quiet:
            console.print(f"[dim]{escape(line)}[/]")

    try:
        manifest = capture_model(request, template_check=template_problem, progress=say)
    except CaptureInterrupted as stop:
        return fail(console, args.json, "interrupted", stop.message, EXIT_INTERRUPTED)
    if args.json:
        print(manifest.model_dump_json(indent=1))
        return EXIT_OK
    render_capture(manifest, out, console)
    console.print(f"capture written to {escape(str(out))}: search it with `kernelforge optimize {escape(str(out))}`")
    return EXIT_OK


def _us(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def _short_op(title: str) -> str:
    return title.removeprefix("aten.").replace(".default ", " ", 1)


def _card_cell(v: Variant) -> str:
    if v.status != "card":
        return f"[dim]{escape(v.reason.split(': ')[0])}[/]"
    text = escape(str(v.card))
    if not v.template:
        text += f" [yellow](no template: {escape(v.template_note)})[/]"
    if v.kind == "pattern":
        text += " [cyan](fused chain: compile only)[/]"
    return text


def render_capture(manifest: CaptureManifest, root: Path, console: Console) -> None:
    """The ranked table: carded variants by expected saving, then the largest without a card, with why."""
    gpu = manifest.device.startswith("cuda")
    console.print(
        f"[bold]{escape(manifest.model_file)}[/] ({escape(manifest.entry)}) on {escape(manifest.device_name)}"
        f" [dim]({escape(manifest.device)}, torch {escape(manifest.torch_version)})[/]"
    )
    console.print(
        f"{manifest.calls} aten calls per forward pass, {len(manifest.variants)} variants; operator time "
        f"{_us(manifest.total_time_us)} us per pass, eager forward {_us(manifest.forward_wall_us)} us wall"
    )
    console.print(f"[dim]times: {escape(manifest.timing_note)}[/]")
    table = Table(title=f"variants of {escape(str(root))}, ranked by expected saving")
    for column in ("#", "id", "variant", "calls", "us/call", "share", "k", "saving", "card / why not"):
        table.add_column(
            column, overflow="fold", justify="right" if column in ("calls", "us/call", "share") else "left"
        )
    carded = [v for v in manifest.variants if v.status == "card"]
    others = sorted((v for v in manifest.variants if v.status == "unsupported"), key=lambda v: -v.share)
    no_kernel = [v for v in manifest.variants if v.status == "no-kernel"]
    for v in [*carded, *others[:SHOW_UNSUPPORTED]]:
        table.add_row(
            str(v.rank),
            v.id,
            escape(_short_op(v.title)),
            str(v.calls),
            _us(v.time_per_call_us),
            f"{v.share:.1%}",
            f"{v.expected_speedup:.2g}x" if v.status == "card" else "-",
            f"{v.expected_saving:.1%}" if v.status == "card" else "-",
            _card_cell(v),
        )
    rest = others[SHOW_UNSUPPORTED:]
    summaries = [
        (rest, f"{len(rest)} more without a card", "kernelforge capture --show DIR --json lists them"),
        (no_kernel, f"{len(no_kernel)} views and allocations", "no kernel runs"),
    ]
    for group, label, note in summaries:
        if group:
            calls, share = sum(v.calls for v in group), sum(v.share for v in group)
            table.add_row("", "", label, str(calls), "", f"{share:.1%}", "", "", f"[dim]{note}[/]")
    console.print(table)
    total = sum(v.expected_saving for v in carded if v.template)
    console.print(
        f"expected saving if every templated card reaches its k: [bold]{total:.1%}[/] of the "
        + ("model's eager GPU time" if gpu else "operator time [dim](CPU capture: k are H200 priors)[/]")
    )


def options_from(args: argparse.Namespace) -> CaptureOptimizeOptions:
    from kernelforge_tui.cli.runs import _tree_overrides, budget_from

    if getattr(args, "run_dir", None):
        raise BadInput("--run-dir names one run; a capture directory gets one run per variant: use --root DIR")

    return CaptureOptimizeOptions(
        budget=budget_from(args),
        top=getattr(args, "top", None),
        proposer=args.proposer,
        strategy=args.strategy,
        tree=_tree_overrides(args.tree or []),
        simulate=args.simulate,
        simulate_seconds=args.simulate_seconds,
        root=Path(args.root) if args.root else None,
        cluster=args.cluster,
    )


def render_report(report: CaptureOptimizeReport) -> Table:
    table = Table(title="optimize " + escape(str(report.capture_dir)) + (" [yellow](SIMULATED)[/]" * report.simulated))
    for column in ("variant", "state", "budget", "best", "eager us/call", "projected", "saving/pass", "run"):
        table.add_column(column, overflow="fold")
    for r in report.results:
        caps = r.budget.model_dump(exclude_none=True)
        best = f"{r.best_speedup:.3g}x over baseline, {r.best_latency_us:.3g} us" if r.best_speedup else "-"
        table.add_row(
            escape(f"{r.variant} {r.title}"),
            r.state + (f" [dim]{escape(r.reason)}[/]" if r.reason else ""),
            escape(", ".join(f"{k.removeprefix('max_')} {v:.3g}" for k, v in caps.items()) or "none"),
            best,
            _us(r.eager_us_per_call),
            _us(r.projected_us_per_call) if r.projected_us_per_call is not None else "-",
            f"{_us(r.saving_us)} us",
            escape(str(r.run_dir or "-")),
        )
    return table


def _summary(report: CaptureOptimizeReport) -> str:
    if not report.comparable:
        return f"projected saving: none ({report.note})"
    label = "SIMULATED projected" if report.simulated else "projected"
    return (
        f"{label} end-to-end saving: {report.projected_saving:.1%} of the model's eager operator time "
        f"({_us(report.saving_us)} of {_us(report.total_time_us)} us per forward pass)"
    )


def cmd_optimize_capture(args: argparse.Namespace, console: Console) -> int:
    """`kernelforge optimize CAPTURE_DIR`: the searches one after another, a line per event, the table at the end."""
    root = Path(args.card)
    options = options_from(args)
    seen: dict[str, tuple[str, float | None]] = {}

    def progress(report: CaptureOptimizeReport) -> None:
        if args.json:
            return
        for r in report.results:
            key = (r.state, r.best_speedup)
            if seen.get(r.variant) == key:
                continue
            seen[r.variant] = key
            if r.state == "running" and r.best_speedup is None:
                caps = ", ".join(
                    f"{k.removeprefix('max_')} {v:.3g}" for k, v in r.budget.model_dump(exclude_none=True).items()
                )
                console.print(
                    f"[bold]{r.variant}[/] {escape(r.title)}: searching [dim](budget: {escape(caps or 'none')})[/]"
                )
            elif r.state == "running":
                console.print(
                    f"  {r.variant}: best {r.best_speedup:.3g}x over the baseline; {escape(_summary(report))}"
                )
            elif r.state in ("finished", "failed", "not-run"):
                console.print(f"  {r.variant}: {r.state} ({escape(r.reason)}); {escape(_summary(report))}")

    try:
        report = asyncio.run(optimize_capture(root, load_settings(), options, progress))
    except asyncio.CancelledError:
        return fail(
            console, args.json, "interrupted", f"interrupted: the report so far is in {root / REPORT}", EXIT_FAILED
        )
    if args.json:
        print(json.dumps(report.model_dump(mode="json") | {"projected_saving": report.projected_saving}, indent=2))
        return EXIT_OK
    console.print(render_report(report))
    for s in report.skipped:
        console.print(f"[dim]skipped {s.variant} {escape(s.title)}: {escape(s.reason)}[/]")
    console.print(f"[bold]{escape(_summary(report))}[/]")
    console.print(f"report: {escape(str(root / REPORT))}")
    return EXIT_OK
