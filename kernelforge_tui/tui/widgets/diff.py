"""The kernel diff: the selected candidate against its parent, the baseline or the best node.

Written over difflib (no third-party diff widget). Unified, or side by side with each side's line numbers; by
default only the changed hunks with `CONTEXT` lines around them, the unchanged runs between them folded into
one line that says how many lines it hides (`o` shows the whole file). Code never wraps or gets cut: the line
numbers stay put and the code scrolls sideways (left/right), both sides of a side-by-side diff together.

Each side is highlighted as CUDA by the tree-sitter grammar in the colours of the TextArea theme that matches
the app theme, each colour nudged (`contrast.readable`) until it reads on the background it is drawn on (the
pane, an added line, a removed line). The pane is a `ScrollView`: rows are laid out once per diff, drawn only
when on screen, and kept per scroll offset.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import ClassVar, Literal

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.events import Resize
from textual.geometry import Size
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kernelforge_tui.tui.contrast import readable_style
from kernelforge_tui.tui.cuda import highlight_lines, syntax_styles

DiffBase = Literal["parent", "baseline", "best"]
DIFF_BASES: tuple[DiffBase, ...] = ("parent", "baseline", "best")
CONTEXT = 3
"""Unchanged lines shown around each change when the rest is folded."""
MIN_FOLD = 2
"""A fold hides at least this many lines (a fold of one line would take the line's own place)."""

RowKind = Literal["same", "removed", "added", "changed", "fold", "note", "names"]


@dataclass(frozen=True)
class DiffRow:
    """One line of the diff as laid out: which old and new lines it shows (0-based), or what it says."""

    kind: RowKind
    old: int | None = None
    new: int | None = None
    hidden: int = 0
    """A fold: how many unchanged lines it stands for."""
    text: str = ""
    """A note's words."""


def diff_rows(old: list[str], new: list[str], side_by_side: bool, context: int | None = CONTEXT) -> list[DiffRow]:
    """The rows of a diff of `old` to `new`; `context` None shows every unchanged line, else only `context` of
    them around each change and folds for the rest. Side by side, a changed block pairs its removed and added
    lines on one row each ("changed"; one side empty where the block has fewer lines on it)."""
    rows: list[DiffRow] = []
    opcodes = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    for index, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag == "equal":
            head = 0 if index == 0 else (context if context is not None else i2 - i1)
            tail = 0 if index == len(opcodes) - 1 else (context if context is not None else i2 - i1)
            hidden = i2 - i1 - head - tail
            if context is None or hidden < MIN_FOLD:
                rows.extend(DiffRow("same", i1 + k, j1 + k) for k in range(i2 - i1))
                continue
            rows.extend(DiffRow("same", i1 + k, j1 + k) for k in range(head))
            rows.append(DiffRow("fold", i1 + head, j1 + head, hidden=hidden))
            rows.extend(DiffRow("same", i2 - tail + k, j2 - tail + k) for k in range(tail))
        elif side_by_side:
            for k in range(max(i2 - i1, j2 - j1)):
                rows.append(DiffRow("changed", i1 + k if i1 + k < i2 else None, j1 + k if j1 + k < j2 else None))
        else:
            rows.extend(DiffRow("removed", old=i) for i in range(i1, i2))
            rows.extend(DiffRow("added", new=j) for j in range(j1, j2))
    return rows


@dataclass
class _Diff:
    """What the pane shows: the two sources as highlighted lines and the rows laid out over them."""

    old_name: str
    new_name: str
    old: list[Text]
    new: list[Text]
    rows: list[DiffRow]
    compared: bool
    """False: `new` alone (nothing to compare with, or identical), numbered, with a note on top."""


class DiffPane(ScrollView, can_focus=True):
    """Scrollable diff of two CUDA sources; its title says against what and how it is laid out."""

    DEFAULT_CSS = """
    DiffPane { background: $surface; color: $foreground; overflow: auto auto; scrollbar-size: 1 1; }
    DiffPane > .diff-pane--added { background: $success 18%; }
    DiffPane > .diff-pane--removed { background: $error 18%; }
    DiffPane > .diff-pane--hunk { color: $secondary; }
    DiffPane > .diff-pane--lineno { color: $text-disabled; }
    DiffPane > .diff-pane--note { color: $text-muted; text-style: italic; }
    DiffPane > .diff-pane--fold { color: $text-muted; background: $panel; }
    /* The terminal's palette has no blends: changed lines in its green and red, as git colours them. */
    DiffPane:ansi > .diff-pane--added { background: ansi_default; color: ansi_green; }
    DiffPane:ansi > .diff-pane--removed { background: ansi_default; color: ansi_red; }
    DiffPane:ansi > .diff-pane--fold { background: ansi_default; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "diff-pane--added",
        "diff-pane--removed",
        "diff-pane--hunk",
        "diff-pane--lineno",
        "diff-pane--note",
        "diff-pane--fold",
    }

    base: var[DiffBase] = var[DiffBase]("parent")
    """What the selected node is compared with (the app binds its own `diff_base` here)."""
    side_by_side = var(False, toggle_class="-side")
    """Two columns with line numbers instead of one unified diff."""
    folded = var(True)
    """Only the changed hunks and a few lines around them, the rest folded; False shows every line."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._current: tuple[str | None, str, str, str] | None = None
        self._diff: _Diff | None = None
        self._message = "select a node"
        self._fits = False
        """The whole diff fits the pane's height: shown unfolded."""
        self._whole = 0
        """Rows of the whole diff, unfolded."""
        self._styles: dict[str, Style] = {}
        self._fixed: dict[tuple[Style, Style], Style] = {}
        self._code: dict[tuple[int, bool], Strip] = {}
        """(row, right side) -> that row's code, highlighted, uncropped."""
        self._strips: LRUCache[tuple[int, int, int], Strip] = LRUCache(1024)
        """(row, scroll x, width) -> the row as drawn."""

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._redraw())
        self._retitle()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._forget_styles()

    def _forget_styles(self) -> None:
        self._styles.clear()
        self._fixed.clear()
        self._code.clear()
        self._strips.clear()

    # -- what is shown ----------------------------------------------------------------------------

    def _retitle(self) -> None:
        """Title and subtitle; where the layout leaves the pane no bottom border (narrow terminals), what is shown
        moves into the title, which drops the word "Diff" to make room."""
        layout = "side by side" if self.side_by_side else "unified"
        if not self.folded:
            shown = "whole file"
        elif self._fits:
            shown = "whole diff (fits)"
        else:
            shown = "changed hunks"
        if self._current is None:
            what = f"vs {self.base}"
        else:
            _, _, old_name, new_name = self._current
            against = f"parent {old_name}" if self.base == "parent" and old_name.startswith("#") else old_name
            what = f"{new_name} vs {against}"
        if self.styles.border_bottom[0] in ("", "none", "hidden"):
            self.border_title = f"{what} · {layout} · {shown}"
            self.border_subtitle = ""
        else:
            self.border_title = f"Diff {what} · {layout}"
            self.border_subtitle = f"{shown} · ←→ scroll"

    def watch_base(self) -> None:
        self._retitle()

    def watch_side_by_side(self) -> None:
        self._retitle()
        self._redraw()

    def watch_folded(self) -> None:
        self._retitle()
        self._redraw()

    @property
    def rows(self) -> list[DiffRow]:
        """The rows laid out now (empty while a message shows)."""
        return self._diff.rows if self._diff is not None else []

    def show(self, old: str | None, new: str, old_name: str, new_name: str) -> None:
        """Diff `old` (None: nothing to compare with) against `new`."""
        key = (old, new, old_name, new_name)
        if key == self._current:
            return
        self._current = key
        self._retitle()
        self._redraw()
        self.scroll_to(0, 0, animate=False, immediate=True)

    def show_message(self, message: str) -> None:
        self._current = None
        self._diff = None
        self._message = message
        self._retitle()
        self._relayout()

    def _redraw(self) -> None:
        if self._current is None or not self.is_mounted:
            return
        old, new, old_name, new_name = self._current
        self._forget_styles()
        theme = self.app.current_theme
        styles = syntax_styles(theme.dark, theme.ansi)
        new_lines = highlight_lines(new, styles)
        if old is None or old == new:
            why = f"nothing to compare with: {old_name}" if old is None else f"identical to {old_name}"
            rows = [DiffRow("note", text=f"{new_name} ({why})")]
            rows += [DiffRow("same", None, j) for j in range(len(new_lines))]
            self._diff = _Diff(old_name, new_name, [], new_lines, rows, compared=False)
        else:
            old_lines = highlight_lines(old, styles)
            # Side by side, a row names the columns; unified, the title names both sides.
            names = [DiffRow("names")] if self.side_by_side else []
            old_split, new_split = old.split("\n"), new.split("\n")
            body = diff_rows(old_split, new_split, self.side_by_side, context=None)
            # Folds only where the whole diff would not fit: a fold that hides lines the pane has room for helps no one.
            self._whole = len(names) + len(body)
            self._fits = self._whole <= self.scrollable_content_region.height
            if self.folded and not self._fits:
                body = diff_rows(old_split, new_split, self.side_by_side, CONTEXT)
            self._diff = _Diff(old_name, new_name, old_lines, new_lines, names + body, compared=True)
        self._retitle()
        self._relayout()

    # -- geometry ---------------------------------------------------------------------------------

    def _digits(self) -> int:
        d = self._diff
        return len(str(max(len(d.old), len(d.new), 1))) if d is not None else 1

    def _gutter(self) -> int:
        """Columns before the code: the line number, a space, and in a unified diff the sign and a space."""
        return self._digits() + (1 if self.side_by_side and self._compared else 3)

    @property
    def _compared(self) -> bool:
        return self._diff is not None and self._diff.compared

    def _halves(self, width: int) -> tuple[int, int]:
        """Side by side: the code columns of the left and the right side (a bar between them)."""
        code = max(2, width - 2 * self._gutter() - 1)
        return code // 2, code - code // 2

    def _longest(self) -> int:
        d = self._diff
        if d is None:
            return len(self._message)
        return max((line.cell_len for line in (*d.old, *d.new)), default=0)

    def _relayout(self) -> None:
        """A new virtual size for what is shown (the width a sideways scroll needs), and nothing drawn kept."""
        self._code.clear()
        self._strips.clear()
        width = self.scrollable_content_region.width
        if self._diff is None:
            self.virtual_size = Size(len(self._message), 1)
        elif self.side_by_side and self._compared:
            left, _ = self._halves(width)
            self.virtual_size = Size(width + max(0, self._longest() - left), len(self._diff.rows))
        else:
            self.virtual_size = Size(self._gutter() + self._longest(), len(self._diff.rows))
        self.refresh()

    def on_resize(self, event: Resize) -> None:
        self._retitle()  # a change of layout may take the bottom border away or give it back
        d = self._diff
        fits = self._whole <= self.scrollable_content_region.height
        if self.folded and d is not None and d.compared and fits != self._fits:
            self._redraw()  # folds come or go with the room
        elif self.side_by_side:
            self._relayout()
        else:
            self._strips.clear()

    # -- drawing ----------------------------------------------------------------------------------

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            if name == "base":
                style = self.rich_style
            else:
                style = self.rich_style + self.get_component_rich_style(f"diff-pane--{name}")
            self._styles[name] = style
        return style

    def _readable(self, style: Style, background: Style) -> Style:
        """`style` drawn over `background`, its colour nudged to read there."""
        key = (style, background)
        fixed = self._fixed.get(key)
        if fixed is None:
            fixed = self._fixed[key] = readable_style(background + style, background.bgcolor)
        return fixed

    def _render_text(self, text: Text, background: Style) -> Strip:
        console = self.app.console
        options = console.options.update(overflow="ignore", no_wrap=True, width=max(1, text.cell_len))
        segments = next(iter(Segment.split_lines(console.render(text, options))), [])
        return Strip([Segment(s.text, self._readable(s.style or Style(), background)) for s in segments])

    def _code_strip(self, index: int, right: bool, background: Style) -> Strip:
        key = (index, right)
        strip = self._code.get(key)
        if strip is None:
            d = self._diff
            assert d is not None
            row = d.rows[index]
            line = row.new if right else row.old
            lines = d.new if right else d.old
            text = lines[line] if line is not None and line < len(lines) else Text("")
            if self.app.current_theme.ansi and row.kind != "same":
                text = Text(text.plain, end="")  # drawn in the row's own colour, as in `git diff`
            strip = self._code[key] = self._render_text(text, background)
        return strip

    def _cell(self, text: str, style: Style, width: int) -> Strip:
        return Strip([Segment(text, self._readable(Style(), style))]).adjust_cell_length(width, style)

    def _row_style(self, row: DiffRow, right: bool) -> Style:
        if row.kind == "removed" or (row.kind == "changed" and not right and row.old is not None):
            return self._style("removed")
        if row.kind == "added" or (row.kind == "changed" and right and row.new is not None):
            return self._style("added")
        return self._style("base")

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        index = scroll_y + y
        base = self._style("base")
        d = self._diff
        if d is None:
            if index == 0:
                return self._cell(self._message, self._style("note"), width)
            return Strip.blank(width, base)
        if index >= len(d.rows):
            return Strip.blank(width, base)
        key = (index, scroll_x, width)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._strips[key] = self._draw(index, scroll_x, width)
        return strip

    def _draw(self, index: int, scroll_x: int, width: int) -> Strip:
        d = self._diff
        assert d is not None
        row = d.rows[index]
        digits = self._digits()
        lineno = self._style("lineno")
        if row.kind == "note":
            return self._cell(row.text, self._style("note"), width)
        if row.kind == "fold":
            first = (row.new or 0) + 1
            words = f"⋯ {row.hidden} unchanged lines ({first}-{first + row.hidden - 1}) folded · o shows all"
            return self._cell(" " * (digits + 1) + words, self._style("fold"), width)
        if self.side_by_side and d.compared:
            left_w, right_w = self._halves(width)
            if row.kind == "names":
                return Strip.join(
                    [
                        self._cell(" " * (digits + 1) + d.old_name, self._style("removed"), digits + 1 + left_w),
                        self._cell("│", lineno, 1),
                        self._cell(" " * (digits + 1) + d.new_name, self._style("added"), digits + 1 + right_w),
                    ]
                )
            parts: list[Strip] = []
            for right, number, code_w in ((False, row.old, left_w), (True, row.new, right_w)):
                background = self._row_style(row, right)
                shown = f"{number + 1:>{digits}} " if number is not None else " " * (digits + 1)
                parts.append(self._cell(shown, lineno + Style(bgcolor=background.bgcolor), digits + 1))
                code = self._code_strip(index, right, background) if number is not None else Strip([])
                parts.append(code.crop_extend(scroll_x, scroll_x + code_w, background))
                if not right:
                    parts.append(self._cell("│", lineno, 1))
            return Strip.join(parts)
        gutter = self._gutter()
        code_w = max(1, width - gutter)
        right = row.kind != "removed"
        number = row.new if right else row.old
        background = self._row_style(row, right)
        sign = {"removed": "-", "added": "+"}.get(row.kind, " ")
        shown = f"{(number or 0) + 1:>{digits}} " + (f"{sign} " if d.compared else "")
        head = self._cell(shown, lineno + Style(bgcolor=background.bgcolor), gutter)
        code = self._code_strip(index, right, background).crop_extend(scroll_x, scroll_x + code_w, background)
        return Strip.join([head, code])
