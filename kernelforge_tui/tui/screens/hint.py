"""A one-line hint for the selected node's next children."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class HintScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    HintScreen { align: center middle; }
    HintScreen > Vertical {
        width: 80; max-width: 100%; height: auto; border: round $primary; background: $surface; padding: 0 1;
    }
    HintScreen Label { color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, node_id: int) -> None:
        super().__init__()
        self.node_id = node_id

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"Hint for #{self.node_id}'s next children"
            yield Input(placeholder="e.g. try warp-shuffle reductions with 8 rows per block", id="hint-input")
            yield Label("enter sends, esc cancels")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        self.dismiss(text or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
