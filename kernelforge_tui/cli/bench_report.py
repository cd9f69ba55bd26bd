"""The bench's report directory: report.md, results.csv, results.json and the plots, all from the manifest.

Why from the manifest alone: `kernelforge bench --report DIR` redraws the report of a bench (finished or not) without
running anything, and the numbers a reader sees are the ones the manifest keeps. The plots need matplotlib (the
`plots` extra); without it the report says how to install it and everything else is written.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernelforge_tui.engine.bench import REPORT, BenchCard, BenchManifest, results
from kernelforge_tui.suite.score import Scored, beats_vendor, scale_scores, score_cards, suite_score
from kernelforge_tui.suite.task import SHORT

if TYPE_CHECKING:
    from matplotlib.container import BarContainer
    from matplotlib.figure import Figure

PLOTS = ("speedup", "roofline", "scale_score")
NO_MATPLOTLIB = (
    "plots skipped: matplotlib is not installed (pip install 'kernelforge-tui[plots]', then rerun with --report)"
)
COLUMNS = (
    "task",
    "family",
    "precision",
    "log2_scale",
    "flops",
    "bytes",
    "status",
    "baseline_us",
    "best_us",
    "speedup",
    "achieved_gbps",
    "achieved_gflops",
    "roofline_share",
    "vendor",
    "vendor_us",
    "vendor_ratio",
    "vendor_agrees",
    "note",
)


def _f(value: float | None, spec: str = ".3g", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _scale(scale: int) -> str:
    return f"2^{scale.bit_length() - 1}"


def roof_note(manifest: BenchManifest) -> str:
    """What each share of the roofline is held against, in words."""
    if manifest.ceilings is not None:
        c = manifest.ceilings
        tensor = c.compute_tflops(["bfloat16"])
        return (
            f"the ceilings measured on {c.gpu_name}: copy {c.copy_gbps:.0f} GB/s, FMA {c.fma_tflops:.1f} TFLOP/s for "
            f"fp32 cards; bf16 cards are held to the tensor-core rate, {tensor:.0f} TFLOP/s (the FMA rate times the "
            "architecture's published ratio)"
        )
    if manifest.simulated and manifest.simulated_ceiling_us is not None:
        return (
            f"the simulation's invented ceiling ({manifest.simulated_ceiling_us:.3g} us for every card: its baseline "
            "time over its top speedup)"
        )
    return "no ceilings measured yet (no card was searched on a GPU)"


def write_report(manifest: BenchManifest, out: Path) -> Path:
    """Write the report directory `out/report` and return it."""
    report = out / REPORT
    report.mkdir(parents=True, exist_ok=True)
    rows = score_cards(results(manifest))
    _json(manifest, rows, report / "results.json")
    _csv(rows, report / "results.csv")
    plotted = _plots(rows, manifest.simulated, report)
    (report / "report.md").write_text(markdown(manifest, rows, plotted))
    return report


def _row_dict(row: Scored) -> dict[str, object]:
    return {column: getattr(row, column) for column in COLUMNS}


def _json(manifest: BenchManifest, rows: Sequence[Scored], path: Path) -> None:
    summary = {
        "simulated": manifest.simulated,
        "gpu_name": manifest.gpu_name,
        "proposer": manifest.options.proposer,
        "minutes_per_task": manifest.options.minutes_per_task,
        "roofline": roof_note(manifest),
        "ceilings": manifest.ceilings.model_dump(mode="json") if manifest.ceilings else None,
        "suite_score": suite_score(rows),
        "scale_scores": {str(s.bit_length() - 1): v for s, v in scale_scores(rows).items()},
        "cards": [_row_dict(row) | {"card": card.card} for row, card in zip(rows, manifest.cards, strict=True)],
    }
    path.write_text(json.dumps(summary, indent=1) + "\n")


def _csv(rows: Sequence[Scored], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in _row_dict(row).items()})


def md_cell(text: str) -> str:
    """Text that stays in its Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(manifest: BenchManifest, rows: Sequence[Scored], plotted: str | None) -> str:
    """report.md: how the bench ran, the scores, every number, the vendor wins, where no template helped."""
    done = sum(c.state in ("finished", "no-template", "failed", "not-run") for c in manifest.cards)
    score = suite_score(rows)
    counted = sum(row.speedup is not None for row in rows)
    lines = ["# Kernel Forge bench", ""]
    if manifest.simulated:
        lines += ["**SIMULATED: every timing is invented (no GPU ran anything); never judge a kernel by it.**", ""]
    options = manifest.options
    minutes = "no minutes cap" if options.minutes_per_task is None else f"{options.minutes_per_task:g} min per task"
    iterations = "" if options.iterations is None else f", at most {options.iterations} candidates per card"
    lines += [
        f"- GPU: {manifest.gpu_name or '-'}"
        + (f", {manifest.gpus} cards at once (one per GPU)" if manifest.gpus > 1 else ""),
        f"- proposer: {options.proposer}; budget: {minutes}{iterations}",
        f"- cards: {done} of {len(manifest.cards)} done" + ("" if manifest.ended_at else " (the bench is not over)"),
        f"- share of the roofline against {roof_note(manifest)}",
        "",
        "## Score",
        "",
        f"**Suite score: {_f(score, '.3f', 'x')}** over {counted} cards: the mean of each card's speedup over its "
        "naive baseline weighted by its FLOP count, so large-scale wins count most. A card no template serves counts "
        "1.0x (nothing was searched); a failed or unrun card does not count.",
        "",
        "| scale | cards | score |",
        "| --- | --- | --- |",
    ]
    for scale, value in scale_scores(rows).items():
        n = sum(row.scale == scale and row.speedup is not None for row in rows)
        lines.append(f"| {_scale(scale)} | {n} | {value:.3f}x |")
    lines += ["", "## Every card", "", _table(rows), ""]
    lines += _vendor_section(rows) + _no_template_section(manifest) + _not_counted_section(manifest)
    lines += ["## Plots", ""]
    if plotted is not None:
        lines.append(plotted)
    else:
        lines += [f"![{name}]({name}.svg)" for name in PLOTS]
    lines.append("")
    return "\n".join(lines)


def _table(rows: Sequence[Scored]) -> str:
    head = (
        "| task | family | precision | scale | FLOPs | bytes | baseline us | best us | speedup | GB/s | GFLOP/s "
        "| roofline | vendor | vendor us | ours/vendor | note |"
    )
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for r in rows:
        vendor = r.vendor or "-"
        if r.vendor and r.vendor_agrees is False:
            vendor += " (disagrees with the reference)"
        lines.append(
            "| "
            + " | ".join(
                md_cell(cell)
                for cell in (
                    r.task,
                    r.family,
                    SHORT[r.precision],
                    _scale(r.scale),
                    f"{r.flops:.3g}",
                    f"{r.bytes:.3g}",
                    _f(r.baseline_us),
                    _f(r.best_us),
                    _f(r.speedup, ".2f", "x"),
                    _f(r.achieved_gbps, ".0f"),
                    _f(r.achieved_gflops, ".0f"),
                    _f(None if r.roofline_share is None else 100 * r.roofline_share, ".0f", "%"),
                    vendor,
                    _f(r.vendor_us),
                    _f(r.vendor_ratio, ".2f"),
                    _short_note(r),
                )
            )
            + " |"
        )
    return "\n".join(lines)


def _short_note(row: Scored) -> str:
    """The table's note: "no template" alone (the section below says why, once per task), other notes whole."""
    if row.status == "no-template":
        return "no template (counted 1.00x)"
    return row.note


def _vendor_section(rows: Sequence[Scored]) -> list[str]:
    lines = ["## Where we beat the vendor", ""]
    wins = beats_vendor(rows)
    timed = sum(row.vendor_ratio is not None for row in rows)
    if not timed:
        lines.append("No vendor was timed (a simulated bench, no torch, or no task with a vendor library).")
    elif not wins:
        lines.append(f"Nowhere: the vendor was as fast or faster on all {timed} cards it was timed on.")
    for row in wins:
        agrees = "" if row.vendor_agrees is not False else " (the vendor disagrees with the reference)"
        lines.append(
            f"- {row.task} {SHORT[row.precision]} {_scale(row.scale)}: {row.best_us:.3g} us against "
            f"{row.vendor} {row.vendor_us:.3g} us ({1 / (row.vendor_ratio or 1):.2f}x faster){agrees}"
        )
    return [*lines, ""]


def _no_template_section(manifest: BenchManifest) -> list[str]:
    lines = ["## Where no template helped", ""]
    missing: dict[str, BenchCard] = {}
    for card in manifest.cards:
        if card.state == "no-template":
            missing.setdefault(card.task, card)
    unhelped = [c for c in manifest.cards if c.state == "finished" and c.improved is False]
    if not missing and not unhelped:
        lines.append("Everywhere a card was searched, a candidate beat its baseline.")
    for name, card in missing.items():
        lines.append(f"- {name} ({card.family}): {card.reason}")
    for card in unhelped:
        lines.append(f"- {card.card}: searched, nothing beat the baseline ({card.reason})")
    return [*lines, ""]


def _not_counted_section(manifest: BenchManifest) -> list[str]:
    left = [c for c in manifest.cards if c.state not in ("finished", "no-template")]
    if not left:
        return []
    lines = ["## Not counted", ""]
    lines += [f"- {c.card}: {c.state}" + (f" ({c.reason})" if c.reason else "") for c in left]
    return [*lines, ""]


def _plots(rows: Sequence[Scored], simulated: bool, report: Path) -> str | None:
    """Draw the plots as PNG and SVG; None when drawn, else the note saying why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return NO_MATPLOTLIB
    tag = " (SIMULATED)" if simulated else ""
    charts: dict[str, Callable[[], Figure]] = {
        "speedup": lambda: per_task_chart(
            rows, lambda r: r.speedup, "speedup over the naive baseline (log scale)" + tag, 1.0, log=True
        ),
        "roofline": lambda: per_task_chart(
            rows,
            lambda r: None if r.roofline_share is None else 100 * r.roofline_share,
            "share of the roofline (%)" + tag,
            100.0,
        ),
        "scale_score": lambda: _by_scale(rows, "suite score by scale" + tag),
    }
    for name, draw in charts.items():
        figure = draw()
        for suffix in ("png", "svg"):
            figure.savefig(report / f"{name}.{suffix}", dpi=120, bbox_inches="tight")
        plt.close(figure)
    return None


def per_task_chart(
    rows: Sequence[Scored], value: Callable[[Scored], float | None], label: str, line: float, *, log: bool = False
) -> Figure:
    """Horizontal bars: a group per task, a bar per scale (one colour each, whichever panel it is in), a panel per
    precision; a dashed line at `line`. Only searched cards have bars (a task no template serves is labelled so, not
    drawn at 1.0x). `log`: a log axis with bars drawn from `line`, so a 100x win and a 0.9x loss both read."""
    import matplotlib.pyplot as plt

    searched = {r.task for r in rows if r.status == "searched"}
    precisions = list(dict.fromkeys(r.precision for r in rows))
    tasks = list(dict.fromkeys(r.task for r in rows))
    scales = sorted({r.scale for r in rows})
    height = 0.8 / max(1, len(scales))
    tall = 1.0 + 0.35 * len(tasks) * max(1, len(scales)) ** 0.5
    figure, axes = plt.subplots(1, len(precisions), figsize=(5 * len(precisions), tall), squeeze=False, sharey=True)
    legend: dict[str, BarContainer] = {}
    for ax, precision in zip(axes[0], precisions, strict=True):
        for k, scale in enumerate(scales):
            ys, xs = [], []
            for t, name in enumerate(tasks):
                match = [r for r in rows if r.task == name and r.precision == precision and r.scale == scale]
                shown = value(match[0]) if match and match[0].status == "searched" else None
                if shown is not None:
                    ys.append(t + (k - (len(scales) - 1) / 2) * height)
                    xs.append(shown)
            if not xs:
                continue
            widths, left = ([x - line for x in xs], line) if log else (xs, 0.0)
            bars = ax.barh(ys, widths, left=left, height=height, label=_scale(scale), color=f"C{k}")
            legend.setdefault(_scale(scale), bars)
        if log:
            ax.set_xscale("log")
        ax.axvline(line, color="grey", linestyle="--", linewidth=1)
        ax.set_title(SHORT[precision])
        ax.set_xlabel(label)
        ax.set_yticks(range(len(tasks)), [t if t in searched else f"{t} (not searched)" for t in tasks])
    axes[0][0].invert_yaxis()  # the axes share y: once turns them all, suite order from the top
    drawn = [_scale(s) for s in scales if _scale(s) in legend]  # every panel's scales, once, smallest first
    axes[0][-1].legend([legend[text] for text in drawn], drawn, title="scale", fontsize="small")
    return figure


def _by_scale(rows: Sequence[Scored], label: str) -> Figure:
    import matplotlib.pyplot as plt

    scores = scale_scores(rows)
    figure, ax = plt.subplots(figsize=(5, 3))
    bars = ax.bar([_scale(s) for s in scores], list(scores.values()), color="tab:blue")
    ax.bar_label(bars, fmt="%.3fx")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_title(label)
    ax.set_ylabel("FLOP-weighted mean speedup")
    ax.set_xlabel("scale (elements of the main tensor)")
    return figure
