"""CUDA syntax highlighting from the tree-sitter-cuda grammar, shared by the diff pane and the editor.

The query is the C, then the C++, then the CUDA `highlights.scm` shipped in the installed grammar
wheels, concatenated (Textual ignores the CUDA file's `; inherits: cpp`), with the captures that no
TextArea theme knows renamed to ones it does, plus the CUDA qualifiers and built-in variables.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual.widgets.text_area import TextAreaTheme
from tree_sitter import Query, QueryCursor

from kernelforge_tui.build.cuda_syntax import cuda_language as cuda_language
from kernelforge_tui.build.cuda_syntax import parse_cuda
from kernelforge_tui.tui.contrast import readable_style

RENAMES = {"@keyword.modifier": "@keyword", "@delimiter": "@punctuation.delimiter"}
EXTRA = """
["__shared__" "__constant__" "__restrict__" "__grid_constant__"] @keyword
((identifier) @variable.builtin (#any-of? @variable.builtin "threadIdx" "blockIdx" "blockDim" "gridDim" "warpSize"))
"""


def _grammar_queries(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return ""
    path = Path(spec.origin).parent / "queries" / "highlights.scm"
    return path.read_text() if path.exists() else ""


@functools.cache
def highlight_query() -> str:
    """The concatenated, renamed highlight query for CUDA."""
    text = "\n".join(_grammar_queries(m) for m in ("tree_sitter_c", "tree_sitter_cpp", "tree_sitter_cuda"))
    for old, new in RENAMES.items():
        text = text.replace(old + " ", new + " ").replace(old + ")", new + ")").replace(old + "\n", new + "\n")
    return text + EXTRA


@functools.cache
def _query() -> Query:
    return Query(cuda_language(), highlight_query())


def highlight_spans(source: str) -> list[list[tuple[int, int, str]]]:
    """Per line of `source`: (start column, end column, capture name) spans, in bytes == chars for ASCII.

    Columns are character offsets (the source is decoded per line), so non-ASCII text stays aligned.
    """
    data = source.encode()
    tree = parse_cuda(data)
    lines = source.split("\n")
    encoded = [line.encode() for line in lines]
    spans: list[list[tuple[int, int, str]]] = [[] for _ in lines]
    captures = QueryCursor(_query()).captures(tree.root_node)
    for name, nodes in captures.items():
        for node in nodes:
            (r0, c0), (r1, c1) = node.start_point, node.end_point
            for row in range(r0, min(r1, len(lines) - 1) + 1):
                raw = encoded[row]
                start = c0 if row == r0 else 0
                end = c1 if row == r1 else len(raw)
                spans[row].append(
                    (len(raw[:start].decode(errors="ignore")), len(raw[:end].decode(errors="ignore")), name)
                )
    for line_spans in spans:
        # Wider captures first, so narrower ones (applied later) win, as in TextArea.
        line_spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
    return spans


def highlight_lines(source: str, styles: dict[str, Style]) -> list[Text]:
    """`source` as one Rich Text a line, styled by capture name (falling back to the name's prefix)."""
    out: list[Text] = []
    for line, spans in zip(source.split("\n"), highlight_spans(source), strict=True):
        text = Text(line, end="")
        for start, end, name in spans:
            style = styles.get(name) or styles.get(name.split(".")[0])
            if style is not None and end > start:
                text.stylize(style, start, end)
        out.append(text)
    return out


ANSI_SYNTAX: dict[str, Style] = {
    **dict.fromkeys(("keyword", "conditional", "repeat", "include", "exception"), Style(color="magenta")),
    **dict.fromkeys(("string", "string.documentation"), Style(color="green")),
    **dict.fromkeys(("number", "float", "boolean", "constant.builtin"), Style(color="cyan")),
    **dict.fromkeys(("type", "type.builtin", "type.class", "class"), Style(color="yellow")),
    **dict.fromkeys(("function", "function.call", "method", "method.call", "constructor"), Style(color="blue")),
    "comment": Style(italic=True),
}
"""Syntax colours for the `ansi` theme: the terminal's own palette, so they read wherever its palette does."""


def syntax_styles(dark: bool, ansi: bool = False) -> dict[str, Style]:
    if ansi:
        return ANSI_SYNTAX
    theme = TextAreaTheme.get_builtin_theme("vscode_dark" if dark else "github_light")
    return dict(theme.syntax_styles) if theme is not None else {}


def editor_theme(dark: bool, ansi: bool = False) -> TextAreaTheme:
    """The editor's colours: the syntax theme the diff uses, each colour (gutter and line numbers included) nudged
    to WCAG AA on the editor's background and on its cursor line; the terminal's palette for the `ansi` theme."""
    if ansi:
        return TextAreaTheme("kernelforge-ansi", syntax_styles=ANSI_SYNTAX)
    base = TextAreaTheme.get_builtin_theme("vscode_dark" if dark else "github_light")
    assert base is not None  # both ship with Textual
    grounds = [s.bgcolor for s in (base.base_style, base.cursor_line_style) if s is not None and s.bgcolor]

    def fix(style: Style | None) -> Style | None:
        if style is None:
            return None
        for ground in grounds:
            style = readable_style(style, style.bgcolor or ground)
        return style

    return TextAreaTheme(
        f"kernelforge-{'dark' if dark else 'light'}",
        base_style=base.base_style,
        gutter_style=fix(base.gutter_style),
        cursor_style=base.cursor_style,
        cursor_line_style=base.cursor_line_style,
        cursor_line_gutter_style=fix(base.cursor_line_gutter_style),
        bracket_matching_style=base.bracket_matching_style,
        selection_style=base.selection_style,
        syntax_styles={name: fix(style) or style for name, style in base.syntax_styles.items()},
    )
