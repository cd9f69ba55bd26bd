"""The preprocessor guard: rules on the source's text and tokens, applied as nvcc's preprocessor reads them.

The preprocessor rules are a guard, not a lint: the text is read as nvcc's preprocessor reads it
(`cuda_tokens`: line ends, splices, comments and digraphs applied, anything ambiguous refused), then
- every directive is on an allow-list: `#include` of an allowed header, `#define`, `#undef`, the
  conditionals, `#pragma unroll`/`nounroll`, `#error`, `#warning`; `#include_next`, `#import`, `#line`,
  gcc line markers and every other pragma are refused, and so is a `#` anywhere but a `#define` body;
- `__has_include`, `__has_include_next`, `__has_embed`, `_Pragma` and `__pragma` are refused wherever they
  appear: they probe host files or turn macros into directives;
- token pasting (`##`) is refused everywhere. Without it no macro can make a new identifier, so every
  identifier the compiler sees after expansion is spelled out in the source, and the scan of identifier
  tokens (macro bodies included) finds every forbidden name (`malloc`, `operator new`, ...).
Why not check `nvcc -E` output instead: preprocessing opens the very files in question (so it needs this
guard first anyway), costs a second compiler run per candidate, and the headers it pulls in mention malloc
and new themselves. The lists themselves are in `source_policy`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator

from kernelforge_tui.build.cuda_tokens import HASH, PASTE, Token
from kernelforge_tui.build.cutlass_headers import ALLOWED_PATTERNS, cutlass_problem, uses_cutlass
from kernelforge_tui.build.source_policy import (
    ALLOWED_DIRECTIVES,
    ALLOWED_PRAGMAS,
    DIRECTIVES_HELP,
    FILE_AND_PRAGMA_OPERATORS,
    FORBIDDEN_NAMES,
    FORBIDDEN_PREFIXES,
)
from kernelforge_tui.build.source_problem import SourceProblem, Where


def check_text(source: str, max_bytes: int) -> SourceProblem | None:
    """Size, encoding and NUL: refused before any parsing, so a huge or binary proposal costs nothing."""
    cap = f"the cap is {max_bytes} bytes: a kernel source is a few KB"
    if len(source) > max_bytes:
        return SourceProblem(line=1, column=1, rule="source-text", message=f"the source is too large; {cap}")
    try:
        size = len(source.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return _raw_problem(source, exc.start, f"character {source[exc.start]!a} is not text (undecodable input)")
    if size > max_bytes:
        return SourceProblem(line=1, column=1, rule="source-text", message=f"the source is {size} bytes; {cap}")
    if (nul := source.find("\0")) >= 0:
        return _raw_problem(source, nul, "NUL character in the source")
    return None


def _raw_problem(source: str, index: int, message: str) -> SourceProblem:
    before = source[:index].replace("\r\n", "\n").replace("\r", "\n")
    line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
    return SourceProblem(line=line, column=column, rule="source-text", message=message)


def _lines(tokens: list[Token]) -> Iterator[list[Token]]:
    line: list[Token] = []
    for token in tokens:
        if token.first and line:
            yield line
            line = []
        line.append(token)
    if line:
        yield line


def check_tokens(
    tokens: list[Token], where: Where, allowed: frozenset[str], placement_news: set[int]
) -> list[SourceProblem]:
    """Directives, then the code and macro bodies, line by line; `placement_news` are the `new` tokens allowed."""
    problems: list[SourceProblem] = []
    for line in _lines(tokens):
        code, in_define = line, False
        if line[0].text in HASH:
            problems.extend(_check_directive(line, where, allowed))
            name = line[1].text if len(line) > 1 else ""
            if name in ("error", "warning"):
                continue  # message text, not code
            code, in_define = line[2:], name == "define"
        problems.extend(_check_code(code, where, in_define, placement_news))
    return problems


def _check_directive(line: list[Token], where: Where, allowed: frozenset[str]) -> list[SourceProblem]:
    if len(line) == 1:
        return []  # the null directive
    name = line[1]
    if name.text == "include":
        return _check_include(line, where, allowed)
    if name.text == "pragma":
        args = line[2:]
        if args and args[0].text in ALLOWED_PRAGMAS and all(t.kind != "literal" for t in args):
            return []
        text = " ".join(t.text for t in line[1:4])
        return [where.problem(line[0].start, "directive-not-allowed", f"#{text} is not allowed; {DIRECTIVES_HELP}")]
    if name.kind == "identifier" and name.text in ALLOWED_DIRECTIVES:
        return []
    what = f"#{name.text}" if name.kind == "identifier" else f"the line marker '# {name.text}'"
    return [where.problem(line[0].start, "directive-not-allowed", f"{what} is not allowed; {DIRECTIVES_HELP}")]


def _check_include(line: list[Token], where: Where, allowed: frozenset[str]) -> list[SourceProblem]:
    path = line[2:]
    if len(path) == 1 and path[0].kind == "header" and _include_allowed(path[0].text[1:-1], allowed):
        return []
    raw = " ".join(t.text for t in path) or "(nothing)"
    message = f"#include {raw} is not allowed; allowed device headers: {', '.join(sorted(allowed))}"
    if uses_cutlass([raw.strip("<>")]) and not allowed >= ALLOWED_PATTERNS:
        message = f"#include {raw} is not allowed here: {cutlass_problem() or 'this build allows no CUTLASS headers'}"
    return [where.problem(line[0].start, "include-not-allowed", message)]


def _include_allowed(name: str, allowed: frozenset[str]) -> bool:
    if ".." in name.split("/"):
        return False
    return any(fnmatch.fnmatchcase(name, pattern) if "*" in pattern else name == pattern for pattern in allowed)


def _check_code(tokens: list[Token], where: Where, in_define: bool, placement_news: set[int]) -> list[SourceProblem]:
    """Rules on the tokens of code and of directive arguments (macro bodies included)."""
    problems: list[SourceProblem] = []
    skip = False
    for i, token in enumerate(tokens):
        if skip:
            skip = False
            continue
        before = tokens[i - 1].text if i > 0 else ""
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        text = token.text
        if text in PASTE:
            problems.append(
                where.problem(
                    token.start,
                    "token-paste",
                    f"'{text}' (token pasting) is not allowed: it builds names the check cannot see; "
                    "write the identifier out",
                )
            )
        elif text in HASH and not in_define:
            problems.append(
                where.problem(token.start, "directive-not-allowed", f"'{text}' is only allowed to begin a directive")
            )
        elif text in FILE_AND_PRAGMA_OPERATORS:
            problems.append(
                where.problem(
                    token.start,
                    "directive-not-allowed",
                    f"'{text}' is not allowed: it probes host files or makes a pragma out of a macro",
                )
            )
        elif text == "operator" and after is not None and after.text in ("new", "delete"):
            problems.append(_forbidden(where, token, f"operator {after.text}"))
            skip = True
        elif token.kind == "identifier" and _is_forbidden(text):
            problems.append(_forbidden(where, token, text))
        elif text == "new" and token.start not in placement_news:
            problems.append(_forbidden(where, token, "new"))
        elif text == "delete" and not (before == "=" and after is not None and after.text == ";"):
            problems.append(_forbidden(where, token, "delete"))
        elif text == "<<" and after is not None and after.text == "<" and after.start == token.end:
            problems.append(
                where.problem(
                    token.start,
                    "host-launch",
                    "kernel launches (<<<...>>>) are not allowed in a candidate: the harness launches the "
                    "entry point from the launch plan; do the work inside this kernel or a __device__ helper",
                )
            )
    return problems


def _is_forbidden(name: str) -> bool:
    return name in FORBIDDEN_NAMES or name.startswith(FORBIDDEN_PREFIXES)


def _forbidden(where: Where, token: Token, name: str) -> SourceProblem:
    return where.problem(
        token.start,
        "forbidden-call",
        f"'{name}' is not allowed: a candidate may not allocate memory, do I/O, create streams or "
        "launch work; use the buffers and shared memory the launch plan provides",
    )
