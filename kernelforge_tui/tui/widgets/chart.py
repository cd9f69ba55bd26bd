"""Column charts in block characters: the run's fastest speedup and best share of the ceiling so far, over its
candidates.

The series come from the app's view of the run (no store read): the finished candidates in the order they were
made (failures count: the search spent them), each point the best of the measured ones so far, as
`engine.takeaway.progress` gives `kernelforge show` its chart. A column is an eighth-block bar, so a chart of a
few rows still shows small steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from kernelforge_tui.engine.view import RunView
from kernelforge_tui.vocabulary.nodes import IN_FLIGHT, MEASURED

EIGHTHS = " ▁▂▃▄▅▆▇█"
AXIS_WIDTH = 8
"""Columns for the value labels left of a chart."""


@dataclass
class Progress:
    """One point per finished candidate: its node id, when it was made, and the bests so far."""

    node_ids: list[int] = field(default_factory=list)
    at: list[float] = field(default_factory=list)
    best_speedup: list[float | None] = field(default_factory=list)
    best_share: list[float | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.node_ids)


def progress_of(view: RunView) -> Progress:
    """The run's bests so far over its finished candidates, in id (creation) order."""
    out = Progress()
    speedup: float | None = None
    share: float | None = None
    for node_id in sorted(view.nodes):
        node = view.nodes[node_id]
        if node.status in IN_FLIGHT:
            continue
        if node.status in MEASURED:
            if node.speedup is not None:
                speedup = max(speedup or 0.0, node.speedup)
            if node.ceiling_share is not None:
                share = max(share or 0.0, node.ceiling_share)
        out.node_ids.append(node_id)
        out.at.append(node.created_at)
        out.best_speedup.append(speedup)
        out.best_share.append(share)
    return out


def resample(values: list[float | None], width: int) -> list[float | None]:
    """`width` columns over `values`: each column the last value of its share of them (a running best's bucket
    maximum); fewer values than columns are stretched."""
    n = len(values)
    if n == 0 or width <= 0:
        return []
    if n >= width:
        return [values[min(n - 1, ((c + 1) * n + width - 1) // width - 1)] for c in range(width)]
    return [values[c * n // width] for c in range(width)]


def column_rows(columns: list[float | None], height: int, top: float, floor: float = 0.0) -> list[str]:
    """The chart's rows, top first: each column a bar of `(value - floor) / (top - floor)` of `height` rows, to an
    eighth of a row (a column at or under the floor, or without a value, is empty)."""
    span = top - floor
    eighths = [
        0 if v is None or span <= 0 else max(0, min(height * 8, round((v - floor) / span * height * 8)))
        for v in columns
    ]
    rows = []
    for row in range(height):
        floor = (height - row - 1) * 8
        rows.append("".join(EIGHTHS[max(0, min(8, e - floor))] for e in eighths))
    return rows


def elapsed(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"+{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"+{s // 60}:{s % 60:02d}"


class ProgressChart(Widget):
    """One series of a `Progress` as a column chart with its value axis and its candidates axis."""

    DEFAULT_CSS = """
    ProgressChart { height: 1fr; background: $surface; color: $foreground; }
    ProgressChart > .progress-chart--axis { color: $text-muted; }
    ProgressChart > .progress-chart--speedup { color: $success; }
    ProgressChart > .progress-chart--share { color: $primary; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "progress-chart--axis",
        "progress-chart--speedup",
        "progress-chart--share",
    }

    def __init__(self, series: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.series = series
        """"speedup" (the fastest so far, x the baseline) or "share" (the best share of the ceiling so far)."""
        self.progress = Progress()

    def show(self, progress: Progress) -> None:
        self.progress = progress
        self.refresh()

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"progress-chart--{name}", partial=True)

    def _label(self, value: float) -> str:
        return f"{value:.2f}x" if self.series == "speedup" else f"{value:.0%}"

    def render(self) -> Text:
        p = self.progress
        values = p.best_speedup if self.series == "speedup" else p.best_share
        title = "fastest so far, x the baseline" if self.series == "speedup" else "best share of the ceiling so far"
        axis, bars = self._style("axis"), self._style(self.series)
        known = [v for v in values if v is not None]
        text = Text(no_wrap=True, overflow="crop", end="")
        if not known:
            text.append(f"{title}: no measured candidate yet", axis)
            return text
        last = known[-1]
        text.append(title, "bold")
        text.append(f": {self._label(last)} after {len(p)} candidates", axis)
        width = max(1, self.size.width - AXIS_WIDTH - 1)
        height = max(1, self.size.height - 3)
        if self.series == "share":
            top, floor = 1.0, 0.0
        else:  # from a little under the slowest best (the baseline, at first) to a little over the fastest
            top, floor = max(known) * 1.05, min(known) * 0.9
        rows = column_rows(resample(values, width), height, top, floor)
        marks = {0: top, height // 2: (top + floor) / 2, height - 1: floor}
        for index, row in enumerate(rows):
            label = self._label(marks[index]) if index in marks else ""
            text.append(f"\n{label:>{AXIS_WIDTH}}", axis)
            text.append("┤" if label else "│", axis)
            text.append(row, bars)
        text.append("\n" + " " * AXIS_WIDTH + "└" + "─" * width, axis)
        first, end = "candidate 1", f"{len(p)} ({elapsed(p.at[-1] - p.at[0])})"
        gap = max(1, width + 1 - len(first) - len(end))
        text.append("\n" + " " * AXIS_WIDTH + first + " " * gap + end, axis)
        return text
