"""A kernel while it is being written: a coder's or debugger's reply, streamed in place of the diff.

Cheap by construction: the view keeps a call's reply as the pieces that arrived, and the pane appends the pieces
it has not shown yet (`Log.write` extends the last line and renders only the lines on screen), once per batch of
events (the app folds events a few times a second), so a long reply is never redrawn whole.
"""

from __future__ import annotations

from textual.widgets import Log

from kernelforge_tui.engine.view import LiveCall


class StreamPane(Log):
    """The reply of one call in flight; `follow` switches to a call, `catch_up` appends what is new."""

    DEFAULT_CSS = """
    StreamPane { background: $surface; color: $foreground; scrollbar-size-vertical: 1; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(highlight=False, auto_scroll=True, id=id, classes=classes)
        self.key: str | None = None
        """The call shown, or None."""
        self.waiting_note = "waiting for the first token"
        """What the subtitle says before the first piece (set by the app: a followed run streams no text)."""
        self._shown = 0
        self._attempt = 0

    def follow(self, call: LiveCall) -> None:
        """Show `call` from its first piece."""
        self.key = call.key
        node = f" for #{call.node_id}" if call.node_id is not None else ""
        self.border_title = f"{call.role} {call.provider}/{call.model} writing{node}"
        self._restart(call)

    def _restart(self, call: LiveCall) -> None:
        self.clear()
        self._shown = 0
        self._attempt = call.attempt
        self.catch_up(call)

    def catch_up(self, call: LiveCall) -> None:
        """Append the pieces of `call` not shown yet; a retry (a new attempt) starts over."""
        if call.attempt != self._attempt:
            self._restart(call)
            return
        new = call.pieces[self._shown :]
        if new:
            # Follow the end, unless the reader scrolled up to read.
            self.write("".join(new), scroll_end=self.is_vertical_scroll_end or self.max_scroll_y == 0)
            self._shown = len(call.pieces)
        retry = f" · attempt {call.attempt}" if call.attempt > 1 else ""
        self.border_subtitle = (f"{call.chars:,} chars" if call.chars else self.waiting_note) + retry

    def stop(self) -> None:
        self.key = None
        self.clear()
