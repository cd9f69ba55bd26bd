"""`v`: how the search is doing, charted: the fastest speedup so far and the best share of the ceiling so far,
over the candidates. Opaque (a translucent screen redraws the main screen beneath whenever a pane changes); the app
hands it the run's view again when nodes arrive or change while it is open."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical

from kernelforge_tui.engine.view import RunView
from kernelforge_tui.tui.screens.closable import ClosableScreen
from kernelforge_tui.tui.widgets.chart import ProgressChart, progress_of


class ChartScreen(ClosableScreen):
    DEFAULT_CSS = """
    ChartScreen { align: center middle; background: $surface; }
    ChartScreen > Vertical { width: 100%; height: 100%; border: round $primary; background: $surface; }
    ChartScreen ProgressChart { margin: 0 1; }
    ChartScreen #chart-speedup { margin-bottom: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "Close", id="chart_close")]

    def __init__(self, view: RunView, close_keys: str = "") -> None:
        super().__init__(close_keys)
        """The keys that opened the screen (the app's, as remapped) close it too."""
        self._view = view

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Progress"
            box.border_subtitle = "over the finished candidates, in the order they were made · esc closes"
            yield ProgressChart("speedup", id="chart-speedup")
            yield ProgressChart("share", id="chart-share")

    def on_mount(self) -> None:
        self.show(self._view)

    def show(self, view: RunView) -> None:
        """Draw the run as it stands (the app calls it again as the run grows)."""
        self._view = view
        progress = progress_of(view)
        for chart in self.query(ProgressChart):
            chart.show(progress)
