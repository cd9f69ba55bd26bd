"""The log: engine events, compiler errors with their line, what each proposer said it tried."""

from __future__ import annotations

import time
from collections import deque
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kernelforge_tui.vocabulary.events import LogLine

MAX_LINES = 2000


def clock(seconds: float) -> str:
    """Time since the run started, `+m:ss` or `+h:mm:ss` (deterministic, timezone-free)."""
    s = max(0, int(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"+{h}:{m:02d}:{sec:02d}" if h else f"+{m}:{sec:02d}"


def wall_clock(at: float) -> str:
    """The local time of day a line was logged, `HH:MM:SS` (the log's title gives the day)."""
    return time.strftime("%H:%M:%S", time.localtime(at))


class LogPane(ScrollView, can_focus=True):
    """A bounded log; multi-line messages (compiler output) keep their lines, indented.

    Lines are kept as `Text` and rendered only when they are on screen (`render_line`, cached per line),
    so adding a batch costs a deque append per line plus one repaint, whatever the batch's size; a
    growing run logs a line a node. It follows the end while the view is at the end.
    """

    DEFAULT_CSS = """
    LogPane { background: $surface; color: $foreground; overflow-y: scroll; scrollbar-size-vertical: 1; }
    LogPane > .log-pane--time { color: $text-disabled; }
    LogPane > .log-pane--debug { color: $text-disabled; }
    LogPane > .log-pane--warning { color: $warning; }
    LogPane > .log-pane--error { color: $error; }
    LogPane > .log-pane--node { color: $secondary; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "log-pane--time",
        "log-pane--debug",
        "log-pane--warning",
        "log-pane--error",
        "log-pane--node",
    }
    BORDER_TITLE = "Log"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.started_at: float | None = None
        self.at_rest = False
        """The run is over: its lines show the time of day they were logged (offsets from a start days ago say
        little); a live run's show the time since its start."""
        self._lines: deque[Text] = deque(maxlen=MAX_LINES)
        self._dropped = 0
        """Lines pushed out of the front so far: a line's cache key is its absolute number."""
        self._widest = 0
        self._styles: dict[str, Style] = {}
        self._strips: LRUCache[tuple[int, int, int], Strip] = LRUCache(1024)
        self._follow = True
        """Keep the last line in view: true until the reader scrolls up, and again once they scroll to the end."""

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._restyle())

    def _restyle(self) -> None:
        self._styles.clear()
        self._strips.clear()
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(f"log-pane--{name}", partial=True)
        return style

    def _write(self, rows: list[Text]) -> None:
        if not rows:
            return
        # Not "at the end now": a horizontal scroll bar that appears takes a row and moves the end by one line.
        follow = self._follow or self.is_vertical_scroll_end or self.max_scroll_y == 0
        overflow = max(0, len(self._lines) + len(rows) - MAX_LINES)
        self._lines.extend(rows)
        self._dropped += overflow
        self._widest = max(self._widest, max(row.cell_len for row in rows))
        self.virtual_size = Size(self._widest, len(self._lines))
        if follow:
            self._follow = True
            self.scroll_end(animate=False, immediate=False, x_axis=False)
            self.call_after_refresh(self._to_end)  # again once laid out: a new scroll bar moves the end
        self.refresh()

    def _to_end(self) -> None:
        if self._follow and self.scroll_y < self.max_scroll_y:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_resize(self) -> None:
        self._to_end()

    def watch_show_horizontal_scrollbar(self) -> None:
        self.call_after_refresh(self._to_end)  # the bar takes a row: the last line moves out of view

    def add(self, lines: list[LogLine]) -> None:
        rows: list[Text] = []
        for line in lines:
            start = self.started_at if self.started_at is not None else line.at
            level_style = self._style(line.level) if line.level in ("debug", "warning", "error") else Style()
            first, *rest = line.text.split("\n") or [""]
            shown = wall_clock(line.at) if self.at_rest else clock(line.at - start)
            row = Text.assemble((shown + " ", self._style("time")), no_wrap=True, end="")
            if line.node_id is not None:
                row.append(f"#{line.node_id} ", self._style("node"))
            row.append(first, level_style)
            rows.append(row)
            rows.extend(Text("    " + more, style=level_style, no_wrap=True, end="") for more in rest)
        self._write(rows)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._follow = new_value >= self.max_scroll_y

    def note(self, text: str) -> None:
        """A line from the TUI itself (what it sent)."""
        self._write([Text("» " + text, style=self._style("node"), no_wrap=True, end="")])

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        rich_style = self.rich_style
        if index >= len(self._lines):
            return Strip.blank(width, rich_style)
        key = (index + self._dropped, scroll_x, width)
        strip = self._strips.get(key)
        if strip is None:
            text = self._lines[index]
            console = self.app.console
            options = console.options.update(overflow="ignore", no_wrap=True, width=max(1, text.cell_len))
            segments = next(iter(Segment.split_lines(console.render(text, options))), [])
            line = Strip(segments).apply_style(rich_style)
            strip = self._strips[key] = line.crop_extend(scroll_x, scroll_x + width, rich_style)
        return strip
