"""`?`: every key, its binding id (for the config keymap) and what it does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from kernelforge_tui.tui.keymap import ACTIONS


@dataclass(frozen=True)
class KeyNote:
    """Keys a pane's own widget binds (Textual's, not ours to remap), as the help names them: `keys[i]` runs
    `actions[i]` on the widget `pane` selects while it has the focus (tests hold the words to the bindings)."""

    pane: str
    keys: tuple[str, ...]
    actions: tuple[str, ...]
    words: str


KEY_NOTES: tuple[tuple[str, tuple[KeyNote, ...]], ...] = (
    (
        "Tree",
        (
            KeyNote("#tree", ("up", "down"), ("cursor_up", "cursor_down"), "move"),
            KeyNote("#tree", ("space",), ("toggle_node",), "opens or closes"),
            KeyNote("#tree", ("enter",), ("select_cursor",), "selects"),
        ),
    ),
    (
        "Diff",
        (
            KeyNote("#diff", ("left", "right"), ("scroll_left", "scroll_right"), "scroll long lines sideways"),
            KeyNote(
                "#diff",
                ("up", "down", "pageup", "pagedown"),
                ("scroll_up", "scroll_down", "page_up", "page_down"),
                "move through it",
            ),
        ),
    ),
    (
        "Anywhere",
        (
            KeyNote("#tree", ("tab",), ("app.focus_next",), "moves between panes"),
            KeyNote(
                "#tree", ("ctrl+p",), ("command_palette",), "opens the command palette (every action is there too)"
            ),
        ),
    ),
)
NOTES = (
    *(f"{title}: " + ", ".join(f"{'/'.join(n.keys)} {n.words}" for n in notes) + "." for title, notes in KEY_NOTES),
    'Remap a key in the config file: [tui.keymap] pause_resume = "space" (ids above).',
    "Glyphs: ○ proposed ◔ built ◑ verified ● timed ◆ profiled ✗ failed; ⊘ banned ⇡ pinned ★ export.",
)


def key_display(key: str) -> str:
    return ", ".join("?" if k == "question_mark" else k for k in key.split(","))


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close", show=False),
    ]

    def __init__(self, keys: dict[str, str] | None = None) -> None:
        super().__init__()
        self.keys = keys or {}

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(style="dim", no_wrap=True)
        table.add_column()
        for action in ACTIONS:
            table.add_row(key_display(self.keys.get(action.id, action.key)), action.id, action.help)
        with VerticalScroll(can_focus=True) as scroll:
            scroll.border_title = "Keys"
            scroll.border_subtitle = "↑↓ pgup pgdn scroll · esc closes"
            yield Static(table)
            yield Static(Text("\n".join(NOTES), style="italic"))

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()  # the arrows scroll what a short terminal cuts off

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
