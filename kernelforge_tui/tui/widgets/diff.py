"""The kernel diff: the selected candidate against its parent, the baseline or the best node.

Written over difflib (no third-party diff widget): unified with hunks, or side by side with line numbers,
each side highlighted as CUDA by the tree-sitter grammar in the colours of the TextArea theme that
matches the app theme.
"""

from __future__ import annotations

import difflib
from typing import ClassVar, Literal

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import ScrollableContainer
from textual.reactive import var
from textual.widgets import Static
from textual.widgets.text_area import TextAreaTheme

from kernelforge_tui.tui.cuda import highlight_lines

DiffBase = Literal["parent", "baseline", "best"]
DIFF_BASES: tuple[DiffBase, ...] = ("parent", "baseline", "best")
CONTEXT = 3


def syntax_styles(dark: bool) -> dict[str, Style]:
    theme = TextAreaTheme.get_builtin_theme("vscode_dark" if dark else "github_light")
    return dict(theme.syntax_styles) if theme is not None else {}


def _no_wrap(group: Group) -> Group:
    """Long source lines scroll sideways instead of wrapping (which would break the columns)."""
    for item in group.renderables:
        if isinstance(item, Text):
            item.no_wrap = True
    return group


class DiffPane(ScrollableContainer, can_focus=True):
    """Scrollable diff of two CUDA sources; its title says against what and how it is laid out."""

    DEFAULT_CSS = """
    DiffPane { background: $surface; }
    DiffPane { overflow: auto auto; }
    DiffPane > Static { width: auto; min-width: 100%; }
    DiffPane.-side > Static { width: 100%; }
    DiffPane > .diff-pane--added { background: $success 20%; }
    DiffPane > .diff-pane--removed { background: $error 20%; }
    DiffPane > .diff-pane--hunk { color: $secondary; }
    DiffPane > .diff-pane--lineno { color: $text-disabled; }
    DiffPane > .diff-pane--note { color: $text-muted; text-style: italic; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "diff-pane--added",
        "diff-pane--removed",
        "diff-pane--hunk",
        "diff-pane--lineno",
        "diff-pane--note",
    }

    base: var[DiffBase] = var[DiffBase]("parent")
    """What the selected node is compared with (the app binds its own `diff_base` here)."""
    side_by_side = var(False, toggle_class="-side")
    """Two columns with line numbers instead of one unified diff."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._body = Static("", id="diff-body")
        self._current: tuple[str | None, str, str, str] | None = None

    def compose(self) -> ComposeResult:
        yield self._body

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._redraw())

    def _retitle(self) -> None:
        self.border_title = f"Diff vs {self.base} · {'side by side' if self.side_by_side else 'unified'}"

    def watch_base(self) -> None:
        self._retitle()

    def watch_side_by_side(self) -> None:
        self._retitle()
        self._redraw()

    def show(self, old: str | None, new: str, old_name: str, new_name: str) -> None:
        """Diff `old` (None: nothing to compare with) against `new`."""
        key = (old, new, old_name, new_name)
        if key == self._current:
            return
        self._current = key
        self._redraw()
        self.scroll_home(animate=False)

    def show_message(self, message: str) -> None:
        self._current = None
        self._body.update(Text(message, style=self.get_component_rich_style("diff-pane--note")))

    def _redraw(self) -> None:
        if self._current is None:
            return
        old, new, old_name, new_name = self._current
        styles = syntax_styles(self.app.current_theme.dark)
        self._body.update(self.render_diff(old, new, old_name, new_name, styles))

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"diff-pane--{name}", partial=True)

    def render_diff(
        self, old: str | None, new: str, old_name: str, new_name: str, styles: dict[str, Style]
    ) -> RenderableType:
        new_lines = highlight_lines(new, styles)
        if old is None:
            note = Text(f"{new_name} (nothing to compare with: {old_name})", style=self._style("note"))
            return _no_wrap(Group(note, *self._numbered(new_lines)))
        if old == new:
            note = Text(f"{new_name} is identical to {old_name}", style=self._style("note"))
            return _no_wrap(Group(note, *self._numbered(new_lines)))
        old_lines = highlight_lines(old, styles)
        matcher = difflib.SequenceMatcher(None, old.split("\n"), new.split("\n"), autojunk=False)
        if self.side_by_side:
            return self._side_by_side(matcher, old_lines, new_lines, old_name, new_name)
        return self._unified(matcher, old_lines, new_lines, old_name, new_name)

    def _numbered(self, lines: list[Text]) -> list[Text]:
        width = len(str(len(lines)))
        lineno = self._style("lineno")
        return [Text.assemble((f"{i:>{width}} ", lineno), line) for i, line in enumerate(lines, 1)]

    def _unified(
        self, matcher: difflib.SequenceMatcher[str], old: list[Text], new: list[Text], old_name: str, new_name: str
    ) -> RenderableType:
        added, removed, hunk = self._style("added"), self._style("removed"), self._style("hunk")
        out: list[Text] = [Text(f"--- {old_name}", style=removed), Text(f"+++ {new_name}", style=added)]
        for group in matcher.get_grouped_opcodes(CONTEXT):
            (_, a1, _, b1, _), (_, _, a2, _, b2) = group[0], group[-1]
            out.append(Text(f"@@ -{a1 + 1},{a2 - a1} +{b1 + 1},{b2 - b1} @@", style=hunk))
            for tag, i1, i2, j1, j2 in group:
                if tag == "equal":
                    out.extend(Text.assemble("  ", line) for line in new[j1:j2])
                    continue
                for line in old[i1:i2]:
                    row = Text.assemble("- ", line)
                    row.stylize(removed)
                    out.append(row)
                for line in new[j1:j2]:
                    row = Text.assemble("+ ", line)
                    row.stylize(added)
                    out.append(row)
        return _no_wrap(Group(*out))

    def _side_by_side(
        self, matcher: difflib.SequenceMatcher[str], old: list[Text], new: list[Text], old_name: str, new_name: str
    ) -> RenderableType:
        added, removed, lineno = self._style("added"), self._style("removed"), self._style("lineno")
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(style=lineno, justify="right", no_wrap=True)
        table.add_column(ratio=1, no_wrap=True, overflow="crop")
        table.add_column(style=lineno, justify="right", no_wrap=True)
        table.add_column(ratio=1, no_wrap=True, overflow="crop")
        table.add_row("", Text(old_name, style=removed), "", Text(new_name, style=added))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            for k in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + k, j1 + k
                left = old[i].copy() if i < i2 else Text("")
                right = new[j].copy() if j < j2 else Text("")
                if tag != "equal":
                    if i < i2:
                        left.stylize(removed)
                    if j < j2:
                        right.stylize(added)
                table.add_row(str(i + 1) if i < i2 else "", left, str(j + 1) if j < j2 else "", right)
        return table
