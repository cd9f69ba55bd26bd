"""Snapshot tests of the screens (80x24 and 160x48, in two themes each): the main screen, the diff side by side,
whole and zoomed, the metrics of a profiled node with its reward, the progress chart, the export prompt and the
help (whole, and scrolled to its end on a short terminal).

The data is the seeded synthetic run (fixed timestamps, times shown relative to the run's start), and
nothing blinks: the tree has no text cursor and no input is focused (the export prompt's cursor is hidden).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.widgets import MetricsPane, SearchTree

from .fakes.synthetic import SyntheticSource
from .fakes.tui import settle

SIZES = pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
THEMES = pytest.mark.parametrize("theme", ["dark", "light"])


def app(theme: str) -> KernelForgeApp:
    return KernelForgeApp(SyntheticSource(40, run_dir=Path("/runs/r-2311-softmax")), TuiSettings(theme=theme))


@THEMES
@SIZES
def test_main_screen(snap_compare: Any, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(app(theme), terminal_size=size)


def test_main_screen_side_by_side_high_contrast(snap_compare: Any) -> None:
    assert snap_compare(app("high-contrast"), terminal_size=(160, 48), press=["s"])


def test_whole_file_side_by_side_scrolled_sideways(snap_compare: Any) -> None:
    assert snap_compare(app("dark"), terminal_size=(160, 48), press=["s", "o", "tab", *["right"] * 30])


@THEMES
@SIZES
def test_zoomed_diff(snap_compare: Any, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(app(theme), terminal_size=size, press=["tab", "z"])


async def _zoom_profiled_metrics(pilot: Pilot[None]) -> None:
    kf = pilot.app
    assert isinstance(kf, KernelForgeApp)
    await settle(kf, pilot)
    profiled = next(n.id for n in kf.state.nodes.values() if n.status == "profiled")
    kf.query_one(SearchTree).select_id(profiled)
    await settle(kf, pilot)
    kf.query_one(MetricsPane).focus()
    await pilot.press("z")
    await settle(kf, pilot)


@THEMES
@SIZES
def test_metrics_of_a_profiled_node_zoomed(snap_compare: Any, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(app(theme), terminal_size=size, run_before=_zoom_profiled_metrics)


@THEMES
@SIZES
def test_progress_chart(snap_compare: Any, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(app(theme), terminal_size=size, press=["v"])


async def _export_prompt(pilot: Pilot[None]) -> None:
    await pilot.press("m")
    await pilot.pause()
    pilot.app.screen.query_one(Input).cursor_blink = False


@pytest.mark.parametrize(
    ("theme", "size"), [("dark", (80, 24)), ("light", (160, 48))], ids=["80x24-dark", "160x48-light"]
)
def test_export_prompt(snap_compare: Any, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(app(theme), terminal_size=size, run_before=_export_prompt)


def test_help_screen(snap_compare: Any) -> None:
    assert snap_compare(app("dark"), terminal_size=(100, 36), press=["question_mark"])


def test_help_screen_scrolled_to_its_end_at_80x24(snap_compare: Any) -> None:
    assert snap_compare(app("light"), terminal_size=(80, 24), press=["question_mark", "end"])
