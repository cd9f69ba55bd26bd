"""Edit a kernel in a TextArea highlighted as CUDA (ctrl+s submits it as a child of the node), or in $EDITOR."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, TextArea

from kernelforge_tui.tui.cuda import cuda_language, editor_theme, highlight_query


class EditorScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    EditorScreen { align: center middle; }
    EditorScreen > Vertical { width: 100%; height: 100%; border: round $primary; background: $surface; }
    EditorScreen TextArea { height: 1fr; border: none; }
    EditorScreen Label { color: $text-muted; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "submit", "Submit as child", id="editor_submit"),
        # Priority: the code editor's TextArea takes esc to move the focus on, and it is the screen's only widget.
        Binding("escape", "cancel", "Cancel", id="editor_cancel", priority=True),
    ]

    def __init__(self, node_id: int, source: str, why_not: Callable[[], str | None] | None = None) -> None:
        super().__init__()
        self.node_id = node_id
        self.source = source
        self.why_not = why_not
        """Why a submission cannot reach the search now (the run ended while the editor was open), or None."""
        self._discarding = False
        """esc was pressed once on a changed kernel: a second esc discards it."""

    def compose(self) -> ComposeResult:
        area = TextArea.code_editor(self.source, id="editor-area", soft_wrap=False)
        area.register_language("cuda", cuda_language(), highlight_query())
        area.language = "cuda"
        theme = editor_theme(self.app.current_theme.dark, self.app.current_theme.ansi)
        area.register_theme(theme)
        area.theme = theme.name
        with Vertical() as box:
            box.border_title = f"Child of #{self.node_id}: same launch plan"
            yield area
            yield Label(
                "ctrl+s submits as a child (evaluated like any candidate), esc closes (twice for a changed one)"
            )

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    def action_submit(self) -> None:
        """Submit the edit; an unchanged kernel, or a run that can no longer take it, is said and the editor stays
        open with the text in it."""
        text = self.query_one(TextArea).text
        if unchanged(text, self.source):
            self.notify(f"No change from #{self.node_id}: nothing to submit (esc closes).", severity="warning")
            return
        why = self.why_not() if self.why_not is not None else None
        if why is not None:
            self.notify(f"Not submitted: {why}. Your text is still here (esc closes).", severity="error")
            return
        self.dismiss(text)

    def action_cancel(self) -> None:
        """Close; a changed kernel is discarded only on a second esc."""
        text = self.query_one(TextArea).text
        if unchanged(text, self.source) or self._discarding:
            self.dismiss(None)
            return
        self._discarding = True
        self.notify("Your edit is not submitted: esc again discards it, ctrl+s submits it.", severity="warning")

    def on_text_area_changed(self) -> None:
        self._discarding = False


def unchanged(text: str, source: str) -> bool:
    """An edit that changed nothing but whitespace at either end."""
    return text.strip() == source.strip()


def keep_edit(node_id: int, text: str) -> Path:
    """An edit that could not be submitted, kept in a file of its own (the temporary one goes with the editor)."""
    fd, name = tempfile.mkstemp(prefix=f"kernelforge-node-{node_id}-edit-", suffix=".cu")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return Path(name)


def edit_externally(app: App[Any], node_id: int, source: str) -> str | None:
    """`source` after $VISUAL or $EDITOR (vi) edited it in the terminal the app hands over (unchanged when the
    user changed nothing); None when the editor could not run (the app says why)."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"node-{node_id}.cu"
        path.write_text(source)
        try:
            with app.suspend():
                subprocess.run([*shlex.split(editor), str(path)], check=False)
        except Exception as exc:  # SuspendNotSupported (headless, some terminals), editor missing
            app.notify(f"Could not run {editor}: {exc}", severity="error")
            return None
        return path.read_text()
