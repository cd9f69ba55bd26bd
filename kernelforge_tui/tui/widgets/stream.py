"""A kernel while it is being written: a coder's or debugger's reply, streamed in place of the diff.

Cheap by construction: the view keeps a call's reply as the pieces that arrived, and the pane appends the pieces
it has not shown yet, once per batch of events (the app folds events a few times a second). Lines are rendered
only when on screen and kept (only the last line and the new ones are drawn again), and the titles change only
when the call or its attempt does. The scrollable size grows in steps (`GROW_LINES`, `GROW_COLUMNS`) rather than
with every line: in Textual a new virtual size is a new layout of the whole screen, so a reply growing line by
line would lay out and repaint every pane a few times a second.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kernelforge_tui.engine.view import LiveCall

WAITING_HERE = "waiting for the first token"
WAITING_ELSEWHERE = "from another process: the text comes at its end"
"""A search in another process streams no text to this one (pieces of replies are not stored)."""
GROW_LINES = 64
GROW_COLUMNS = 40
_CONTROL = {code: "�" for code in (*range(0, 9), *range(11, 32), 127)}
"""Control characters a model may write (an escape sequence would reach the terminal): shown as one glyph."""


def _step(n: int, step: int) -> int:
    return (n // step + 1) * step


class StreamPane(ScrollView, can_focus=True):
    """The reply of one call in flight; `follow` switches to a call, `catch_up` appends what is new."""

    DEFAULT_CSS = """
    StreamPane { background: $surface; color: $foreground; overflow: auto auto; scrollbar-size-vertical: 1; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.key: str | None = None
        """The call shown, or None."""
        self.waiting_note = WAITING_HERE
        """What the subtitle says before the first piece (the app sets WAITING_ELSEWHERE for a followed run)."""
        self.lines: list[str] = []
        self._strips: dict[int, tuple[int, int, Strip]] = {}
        """Line index -> (scroll x, width, the line as drawn)."""
        self._style: Style | None = None
        self._widest = 0
        self._shown = 0
        self._attempt = 0
        self._bottom = 0
        """The scroll offset that put the last line at the bottom after the last write: at or past it, follow."""

    # -- the call shown ---------------------------------------------------------------------------

    def follow(self, call: LiveCall) -> None:
        """Show `call` from its first piece."""
        self.key = call.key
        node = f" for #{call.node_id}" if call.node_id is not None else ""
        self.border_title = f"{call.role} {call.provider}/{call.model} writing{node}"
        self._restart(call)

    def catch_up(self, call: LiveCall) -> None:
        """Append the pieces of `call` not shown yet; a retry (a new attempt) starts over."""
        if call.attempt != self._attempt:
            self._restart(call)
            return
        new = call.pieces[self._shown :]
        if new:
            self._append("".join(new))
            self._shown = len(call.pieces)
        # A title is a repaint of the whole pane: change it only when what it says changes.
        retry = f"attempt {call.attempt}" if call.attempt > 1 else ""
        subtitle = retry if call.pieces else " · ".join(filter(None, (self.waiting_note, retry)))
        if self.border_subtitle != subtitle:
            self.border_subtitle = subtitle

    def stop(self) -> None:
        self.key = None
        self._clear()

    def _restart(self, call: LiveCall) -> None:
        self._clear()
        self._attempt = call.attempt
        self.catch_up(call)

    # -- text -------------------------------------------------------------------------------------

    def _clear(self) -> None:
        self.lines.clear()
        self._strips.clear()
        self._widest = self._shown = self._bottom = 0
        self.virtual_size = Size(0, 0)
        self.scroll_to(0, 0, animate=False, immediate=True)
        self.refresh()

    def _append(self, text: str) -> None:
        follow = self.scroll_y >= self._bottom
        first, *more = text.translate(_CONTROL).expandtabs(4).split("\n")
        start = max(0, len(self.lines) - 1)
        if self.lines:
            self.lines[-1] += first
        else:
            self.lines.append(first)
        self.lines.extend(more)
        changed = range(start, len(self.lines))
        for index in changed:
            self._strips.pop(index, None)
        self._widest = max(self._widest, *(cell_len(self.lines[i]) for i in changed))
        size = self.virtual_size
        if self._widest > size.width or len(self.lines) > size.height:
            width = size.width if self._widest <= size.width else _step(self._widest, GROW_COLUMNS)
            height = size.height if len(self.lines) <= size.height else _step(len(self.lines), GROW_LINES)
            self.virtual_size = Size(width, height)
        self._bottom = max(0, len(self.lines) - self.scrollable_content_region.height)
        if follow:
            self.scroll_to(y=self._bottom, animate=False, immediate=True)
        self.refresh_lines(start, len(changed))

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if self._style is None:
            self._style = self.rich_style
        style = self._style
        if index >= len(self.lines):
            return Strip.blank(width, style)
        cached = self._strips.get(index)
        if cached is not None and cached[:2] == (scroll_x, width):
            return cached[2]
        line = self.lines[index]
        strip = Strip([Segment(line, style)], cell_len(line)).crop_extend(scroll_x, scroll_x + width, style)
        self._strips[index] = (scroll_x, width, strip)
        return strip

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._style = None
        self._strips.clear()
