"""Translation phases 1-3 of a CUDA source as nvcc 13's preprocessor applies them, with original positions.

Why: the source check must see the directives and identifiers the compiler sees, not the raw text. nvcc
preprocesses with the host compiler (`gcc -E -std=c++17`), which, before any directive is read, ends lines
at LF, CRLF or a lone CR, deletes every backslash-newline (also with blanks between them, as gcc does),
turns comments into a space and reads digraphs (`%:` is `#`, `%:%:` is `##`). Trigraphs are off in C++17
(gcc ignores them), but a flag could turn them back on, so they are refused rather than translated.

Wherever the compiler's reading could differ from this one, the source is refused instead of guessed:
unterminated literals and comments (gcc ends a bad literal at the line end, so a `/*` after `it's` is no
comment to gcc), raw string literals (phase 2 is undone inside them), and backslashes outside literals
(universal character names in identifiers).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Literal

TokenKind = Literal["identifier", "number", "literal", "header", "punct"]

_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
_TRIGRAPH = re.compile(r"\?\?[=/'()!<>\-]")
_HEADER = re.compile(r'<[^>\n]*>|"[^"\n]*"')  # a header name has no escapes
_HEADER_DIRECTIVES = frozenset({"include", "include_next", "import"})
_PREFIX = r"(?:u8|[uUL])?"
_SCAN = re.compile(
    rf"""
    (?P<newline>\n)
    |(?P<blank>[ \t\f\v]+)
    |(?P<comment>//[^\n]*|/\*.*?\*/)
    |(?P<open_comment>/\*)
    |(?P<raw>{_PREFIX}R")
    |(?P<literal>{_PREFIX}(?:"(?:[^"\\\n]|\\[^\n])*"|'(?:[^'\\\n]|\\[^\n])*'))
    |(?P<open_literal>{_PREFIX}["'])
    |(?P<identifier>[A-Za-z_$\x80-\U0010ffff][\w$\x80-\U0010ffff]*)
    |(?P<number>\.?\d(?:[eEpP][+-]|'[\w$]|[\w$.\x80-\U0010ffff])*)
    |(?P<backslash>\\)
    |(?P<punct><(?=::(?![:>]))|%:%:|\.\.\.|<=>|<<=|>>=|->\*|\#\#|<:|:>|<%|%>|%:|::|->|\+\+|--|<<|>>|<=|>=|==|!=
        |&&|\|\||\+=|-=|\*=|/=|%=|&=|\^=|\|=|\.\*|.)
    """,
    re.VERBOSE | re.DOTALL,
)
"""One token (or blank, comment, line end) at a time; punctuators longest first, as gcc's maximal munch
takes them (`<::` is `<` then `::`, C++11); a `.` at the end catches every other character."""

_TOKEN_KINDS: dict[str, TokenKind] = {k: k for k in ("identifier", "number", "literal", "header", "punct")}
_REFUSED = {
    "open_comment": "unterminated comment: close it with */",
    "raw": "raw string literals are not allowed: write an ordinary string literal",
    "open_literal": "unterminated literal: close it on the same line",
    "backslash": "a backslash outside a literal is not allowed (universal character names included)",
}
HASH = frozenset({"#", "%:"})
PASTE = frozenset({"##", "%:%:"})


class LexError(ValueError):
    """The source cannot be read the way the compiler reads it; `offset` is in the logical text."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


@dataclass(frozen=True, slots=True)
class Token:
    """One preprocessing token of the logical text; `first` when it begins a line (comments are blanks)."""

    kind: TokenKind
    text: str
    start: int
    end: int
    first: bool


@dataclass(frozen=True)
class Logical:
    """The source after phases 1-2 (line ends made LF, splices deleted) and the way back to the original.

    `starts[k]` is the logical offset where the k-th spliced piece begins and `shifts[k]` how many original
    characters were deleted before it, so a logical offset maps back with one bisection.
    """

    original: str
    """The source with every line end made LF: the lines that line numbers count."""
    text: str
    starts: list[int]
    shifts: list[int]

    def original_offset(self, offset: int) -> int:
        return offset + self.shifts[bisect.bisect_right(self.starts, offset) - 1]

    def position(self, offset: int) -> tuple[int, int]:
        """1-based line and column in the original source of a logical offset."""
        at = self.original_offset(offset)
        line_start = self.original.rfind("\n", 0, at) + 1
        return self.original.count("\n", 0, at) + 1, at - line_start + 1


def logical_source(source: str) -> Logical:
    """Phases 1 and 2: line ends to LF, backslash-newlines deleted."""
    original = source.replace("\r\n", "\n").replace("\r", "\n")
    pieces: list[str] = []
    starts, shifts = [0], [0]
    position = length = 0
    for match in _SPLICE.finditer(original):
        pieces.append(original[position : match.start()])
        length += match.start() - position
        position = match.end()
        starts.append(length)
        shifts.append(position - length)
    pieces.append(original[position:])
    return Logical(original=original, text="".join(pieces), starts=starts, shifts=shifts)


def tokenize(logical: Logical) -> list[Token]:
    """Phase 3: the preprocessing tokens, comments dropped; LexError where the reading would be a guess."""
    text = logical.text
    if match := _TRIGRAPH.search(text):
        raise LexError(match.start(), f"trigraph '{match.group()}' is not allowed: write the character it stands for")
    tokens: list[Token] = []
    line: list[Token] = []  # the current line's tokens: `#include` reads a header name next
    position = 0
    while position < len(text):
        if (
            text[position] in '<"'
            and len(line) == 2
            and line[0].text in HASH
            and line[1].text in _HEADER_DIRECTIVES
            and (header := _HEADER.match(text, position))
        ):
            match, kind = header, "header"
        else:
            found = _SCAN.match(text, position)
            assert found is not None and found.lastgroup is not None  # the last alternative takes any character
            match, kind = found, found.lastgroup
        if kind == "newline":
            line = []
        elif (token_kind := _TOKEN_KINDS.get(kind)) is not None:
            token = Token(token_kind, match.group(), position, match.end(), not line)
            tokens.append(token)
            line.append(token)
        elif kind in _REFUSED:
            raise LexError(position, _REFUSED[kind])
        position = match.end()
    return tokens
