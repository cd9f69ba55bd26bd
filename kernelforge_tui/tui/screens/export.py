"""Where the export key writes the selected node's kernel: a folder, offered beside the run and editable."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from kernelforge_tui.engine.takeaway import KERNEL_FILE, PLAN_FILE, SUMMARY_FILE


class ExportScreen(ModalScreen[Path | None]):
    """One line: the folder, prefilled; enter writes there, esc cancels."""

    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical {
        width: 100; max-width: 100%; height: auto; border: round $primary; background: $surface; padding: 0 1;
    }
    ExportScreen Label { color: $text-muted; width: 100%; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, node_id: int, default: Path) -> None:
        super().__init__()
        self.node_id = node_id
        self.default = default

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"Export #{self.node_id}'s kernel to"
            yield Input(str(self.default), id="export-dir")
            yield Label(f"enter writes {KERNEL_FILE}, {PLAN_FILE} and {SUMMARY_FILE} into this folder, esc cancels")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        self.dismiss(Path(text).expanduser() if text else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
