"""Helpers for driving the TUI in tests: what the screen says, and waiting for the app's reads."""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass

from rich.console import Console
from textual.pilot import Pilot

from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.widgets import MetricsPane


def screen_text(app: KernelForgeApp) -> str:
    """What the terminal shows, as plain text (from the SVG screenshot, a public API)."""
    svg = app.export_screenshot()
    lines = re.findall(r"<text[^>]*>(.*?)</text>", svg)
    return html.unescape("".join(lines)).replace("\xa0", " ")


def metrics_text(app: KernelForgeApp) -> str:
    """The metrics pane's whole text at 120 columns, scrolled into view or not."""
    pane = app.query_one(MetricsPane)
    assert pane._current is not None
    console = Console(width=120, file=io.StringIO(), record=True, color_system=None)
    console.print(pane.render_detail(*pane._current))
    return console.export_text()


async def settle(app: KernelForgeApp, pilot: Pilot[None]) -> None:
    """Wait for the app's reads from its source (thread workers; not the engine), then for the screen."""
    await pilot.pause()
    await app.workers.wait_for_complete([w for w in app.workers if w.group != "engine"])
    await pilot.pause()


@dataclass(frozen=True)
class Drawn:
    """A run of characters as the terminal draws it: its text, colour, background and row (from the SVG)."""

    text: str
    fg: str
    bg: str
    row: int
    col: int


SVG_DEFAULT_BACKGROUND = "#292929"
"""The background Rich's SVG export draws where a cell has none of its own (the terminal's default)."""


def drawn(svg: str) -> list[Drawn]:
    """Every non-blank run of text in an SVG screenshot with the colours it is drawn in.

    Rich writes a run's background as a `rect` at the run's own x and line (only where it has one) and its text
    as a `text` whose class names its fill, in the same order; a run without a `rect` is on the default."""
    fills = dict(re.findall(r"\.terminal-\d+-(r\d+) \{ fill: (#[0-9a-f]{6})", svg))
    line = float(re.search(r"line-height: ([\d.]+)px", svg)[1])  # type: ignore[index]
    backgrounds = {
        (round(float(x), 1), round((float(y) - 1.5) / line)): fill
        for fill, x, y in re.findall(r'<rect fill="(#[0-9a-f]{6})" x="([\d.]+)" y="([\d.]+)"[^>]*crispEdges', svg)
    }
    out = []
    pattern = r'<text class="terminal-\d+-(r\d+)" x="([\d.]+)" y="([\d.]+)" textLength="([\d.]+)"[^>]*>([^<]*)<'
    texts = re.findall(pattern, svg)
    cell = min((float(length) / len(html.unescape(t)) for _, _, _, length, t in texts if t), default=1.0)
    for cls, x, y, _, text in texts:
        row = int(float(y) // line)
        plain = html.unescape(text).replace("\xa0", " ")
        if plain.strip():
            bg = backgrounds.get((round(float(x), 1), row), SVG_DEFAULT_BACKGROUND)
            out.append(Drawn(plain, fills[cls], bg, row, round(float(x) / cell)))
    return out
