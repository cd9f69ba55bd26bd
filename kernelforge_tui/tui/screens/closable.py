"""A modal view that closes with escape, q, or the key that opened it (so one key toggles it)."""

from __future__ import annotations

from textual import events
from textual.screen import ModalScreen


class ClosableScreen(ModalScreen[None]):
    """Each view screen binds escape and q to `close` (with its own binding id); `close_keys` are the keys that
    opened it, as the keymap has them (comma-separated), which close it too."""

    def __init__(self, close_keys: str = "") -> None:
        super().__init__()
        self.close_keys = frozenset(close_keys.split(",")) - {""}

    def on_key(self, event: events.Key) -> None:
        if event.key in self.close_keys:
            event.stop()
            self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
