"""The log: engine events, compiler errors with their line, what each proposer said it tried."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.widgets import RichLog

from kernelforge_tui.engine.events import LogLine

MAX_LINES = 2000


def clock(seconds: float) -> str:
    """Time since the run started, `+m:ss` or `+h:mm:ss` (deterministic, timezone-free)."""
    s = max(0, int(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"+{h}:{m:02d}:{sec:02d}" if h else f"+{m}:{sec:02d}"


class LogPane(RichLog):
    """A bounded log; multi-line messages (compiler output) keep their lines, indented."""

    DEFAULT_CSS = """
    LogPane { background: $surface; scrollbar-size-vertical: 1; }
    LogPane > .log-pane--time { color: $text-disabled; }
    LogPane > .log-pane--debug { color: $text-disabled; }
    LogPane > .log-pane--warning { color: $warning; }
    LogPane > .log-pane--error { color: $error; }
    LogPane > .log-pane--node { color: $secondary; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "log-pane--time", "log-pane--debug", "log-pane--warning", "log-pane--error", "log-pane--node",
    }  # fmt: skip

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=MAX_LINES, wrap=False, markup=False, highlight=False, auto_scroll=True)
        self.started_at: float | None = None

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"log-pane--{name}", partial=True)

    def add(self, lines: list[LogLine]) -> None:
        for line in lines:
            start = self.started_at if self.started_at is not None else line.at
            level_style = self._style(line.level) if line.level in ("debug", "warning", "error") else Style()
            first, *rest = line.text.split("\n") or [""]
            row = Text.assemble((clock(line.at - start) + " ", self._style("time")))
            if line.node_id is not None:
                row.append(f"#{line.node_id} ", self._style("node"))
            row.append(first, level_style)
            self.write(row)
            for more in rest:
                self.write(Text("    " + more, style=level_style))

    def note(self, text: str) -> None:
        """A line from the TUI itself (what it sent)."""
        self.write(Text("» " + text, style=self._style("node")))
