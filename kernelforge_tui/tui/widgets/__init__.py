"""The TUI's panes, one module each."""

from kernelforge_tui.tui.widgets.diff import DiffPane
from kernelforge_tui.tui.widgets.header import RunHeaderBar
from kernelforge_tui.tui.widgets.log import LogPane
from kernelforge_tui.tui.widgets.metrics import MetricsPane
from kernelforge_tui.tui.widgets.stream import StreamPane
from kernelforge_tui.tui.widgets.tree import SearchTree

__all__ = ["DiffPane", "LogPane", "MetricsPane", "RunHeaderBar", "SearchTree", "StreamPane"]
