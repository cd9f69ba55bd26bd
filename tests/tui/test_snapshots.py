"""Snapshot tests of the screens (80x24 and 160x48, in two themes each): the main screen, the diff side by side,
whole and zoomed, the metrics of a profiled node with its reward, the progress chart, the export prompt and the
help (whole, and scrolled to its end on a short terminal).

The data is the seeded synthetic run (fixed timestamps, times shown relative to the run's start), and
nothing blinks: the tree has no text cursor and no input is focused (the export prompt's cursor is hidden). The
screens are drawn once per theme (tests/support/fakes/screens.py), for these tests and the contrast tests alike.
"""

from __future__ import annotations

import pytest
from pytest_textual_snapshot import SVGImageExtension
from syrupy.assertion import SnapshotAssertion

from tests.support.fakes.screens import drawings, group, themed

SIZES = pytest.mark.parametrize("size", ["80x24", "160x48"])
THEMES = pytest.mark.parametrize("theme", themed("dark", "light"))


@pytest.fixture
def svg_snapshot(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    """syrupy's snapshot as pytest-textual-snapshot keeps SVGs: one file a test, the screenshot's id left out."""
    return snapshot.use_extension(SVGImageExtension)


@THEMES
@SIZES
def test_main_screen(svg_snapshot: SnapshotAssertion, theme: str, size: str) -> None:
    assert svg_snapshot == drawings(theme)[f"main {size}"].svg


@group("high-contrast")
def test_main_screen_side_by_side_high_contrast(svg_snapshot: SnapshotAssertion) -> None:
    assert svg_snapshot == drawings("high-contrast")["side by side"].svg


@group("dark")
def test_whole_file_side_by_side_scrolled_sideways(svg_snapshot: SnapshotAssertion) -> None:
    assert svg_snapshot == drawings("dark")["whole file side by side scrolled sideways"].svg


@THEMES
@SIZES
def test_zoomed_diff(svg_snapshot: SnapshotAssertion, theme: str, size: str) -> None:
    assert svg_snapshot == drawings(theme)[f"zoomed diff {size}"].svg


@THEMES
@SIZES
def test_metrics_of_a_profiled_node_zoomed(svg_snapshot: SnapshotAssertion, theme: str, size: str) -> None:
    assert svg_snapshot == drawings(theme)[f"metrics zoomed {size}"].svg


@THEMES
@SIZES
def test_progress_chart(svg_snapshot: SnapshotAssertion, theme: str, size: str) -> None:
    assert svg_snapshot == drawings(theme)[f"chart {size}"].svg


@pytest.mark.parametrize(
    ("theme", "size"),
    [
        pytest.param("dark", "80x24", id="80x24-dark", marks=group("dark")),
        pytest.param("light", "160x48", id="160x48-light", marks=group("light")),
    ],
)
def test_export_prompt(svg_snapshot: SnapshotAssertion, theme: str, size: str) -> None:
    assert svg_snapshot == drawings(theme)[f"export {size}"].svg


@group("dark")
def test_help_screen(svg_snapshot: SnapshotAssertion) -> None:
    assert svg_snapshot == drawings("dark")["help 100x36"].svg


@group("light")
def test_help_screen_scrolled_to_its_end_at_80x24(svg_snapshot: SnapshotAssertion) -> None:
    assert svg_snapshot == drawings("light")["help end 80x24"].svg
