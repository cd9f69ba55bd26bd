"""Snapshot tests of the main screen (80x24 and 160x48, dark and light) and of the help screen.

The data is the seeded synthetic run (fixed timestamps, times shown relative to the run's start), and
nothing blinks: the tree has no text cursor and no input is focused.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings

from .fakes.synthetic import SyntheticSource


def app(theme: str) -> KernelForgeApp:
    return KernelForgeApp(SyntheticSource(40), TuiSettings(theme=theme))


@pytest.mark.parametrize("theme", ["dark", "light"])
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_main_screen(snap_compare: Any, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(app(theme), terminal_size=size)


def test_main_screen_side_by_side_high_contrast(snap_compare: Any) -> None:
    assert snap_compare(app("high-contrast"), terminal_size=(160, 48), press=["s"])


def test_help_screen(snap_compare: Any) -> None:
    assert snap_compare(app("dark"), terminal_size=(100, 36), press=["question_mark"])
