"""Reading nvcc's output: what is kept of it, the diagnostics in it, and ptxas's per-kernel statistics.

Why apart from the build: the builder runs nvcc; this module only reads text, so the formats it knows (EDG's
`file(line): error: ...`, gcc's `file:line:col: error: ...`, `ptxas error : ...`, `ptxas info : Used N
registers`) can be tested from strings alone. What is kept of a log is only what it says about the candidate
and what ptxas and nvcc say: a message about any other file becomes a line saying it was withheld.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from kernelforge_tui.vocabulary.evaluation import SOURCE_NAME, Diagnostic, PtxasStats

# EDG front end: `candidate.cu(3): error: identifier "x" is undefined` (also `warning #177-D:`).
_EDG = re.compile(
    r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning)(?: #[\w-]+)?: (?P<msg>.*)$"
)
# GCC-style preprocessor: `candidate.cu:1:10: fatal error: nope.h: No such file or directory`.
_GCC = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):(?P<col>\d+): (?P<sev>fatal error|error|warning): (?P<msg>.*)$")
# Tools: `ptxas error   : Entry function 'k' uses too much shared data (...)`,
# `ptxas /tmp/x.ptx, line 26; error   : Unknown symbol 'r'`, `nvcc fatal   : Unsupported gpu architecture`.
_TOOL = re.compile(r"^(?P<tool>nvcc|ptxas|nvlink)(?: [^;]*;)?\s+(?P<sev>error|warning|fatal)\s*: (?P<msg>.*)$")
_CARET = re.compile(r"^ *\^$")
_CANDIDATE = re.compile(rf"^{re.escape(SOURCE_NAME)}[(:]")
_SUMMARY = re.compile(rf'^\d+ errors? detected in the compilation of "{re.escape(SOURCE_NAME)}"\.$')
_OTHER_FILE = re.compile(r"^\S[^:(]*(?:\(\d+\)|:\d+(?::\d+)?):\s")
_REACHED_FROM = re.compile(rf"at line (\d+) of {re.escape(SOURCE_NAME)}")
_WITHHELD = re.compile(
    r"^kernelforge withheld: (?P<sev>error|warning) in another file(?:, reached from line (?P<line>\d+))?"
)
_IN_HEADER = re.compile(
    r"^kernelforge: (?P<sev>error|warning) in header (?P<where>\S+)(?:, reached from line (?P<line>\d+))?: (?P<msg>.*)$"
)
HEADER_MESSAGE_CHARS = 300
"""A readable header's message is kept to this: a template's types can run to kilobytes."""
_DIED = re.compile(r"^nvcc error\s*: '[\w.+-]+' died due to signal (\d+)", re.MULTILINE)  # nvcc's own line only
_GCC_GUTTER = re.compile(r"^ *\d* \| ")

_MESSAGE_START = re.compile(rb"^[^ \t\r\n]", re.MULTILINE)
_INTERMEDIATE = re.compile(rf"tmpxft_[0-9a-f]+_[0-9a-f]+-\d+_(?={re.escape(Path(SOURCE_NAME).stem)}\.)")

_PTX_ENTRY = re.compile(r"ptxas info\s+: Compiling entry function '(?P<name>[^']+)'")
_PTX_PROPS = re.compile(r"ptxas info\s+: Function properties for (?P<name>\S+)")
_PTX_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
)
_PTX_USED = re.compile(r"ptxas info\s+: Used (?P<regs>\d+) registers(?P<rest>.*)$")
_PTX_BARRIERS = re.compile(r"used (\d+) barriers")
_PTX_SMEM = re.compile(r"(\d+) bytes smem")
_PTX_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


class OutputCap:
    """nvcc's output as it is read: its head kept, up to `max_bytes` and `max_messages` messages (a line that
    does not start with a blank starts one), and what came after counted. Why: the output grows with what the
    source asks for (one warning per copy of a statement), so it is bounded while it is read, not after."""

    def __init__(self, max_bytes: int, max_messages: int) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.read_bytes = 0
        self.messages = 0
        self.overflowed = False
        self._kept = bytearray()
        self._line_start = True

    def feed(self, chunk: bytes) -> bool:
        """Take the next chunk; False once the output is over a cap (the caller stops nvcc)."""
        self.read_bytes += len(chunk)
        if self.overflowed or not chunk:
            return not self.overflowed
        end = len(chunk)
        for match in _MESSAGE_START.finditer(chunk):
            if match.start() == 0 and not self._line_start:
                continue  # the rest of a line begun in the previous chunk
            self.messages += 1
            if self.messages > self.max_messages:
                end = match.start()
                self.overflowed = True
                break
        room = self.max_bytes - len(self._kept)
        if end > room:
            end = room
            self.overflowed = True
        self._kept += chunk[:end]
        self._line_start = chunk.endswith(b"\n")
        return not self.overflowed

    def text(self) -> str:
        """What was kept, decoded; once over a cap, only whole lines."""
        kept = bytes(self._kept)
        if self.overflowed:
            kept = kept[: kept.rfind(b"\n") + 1]
        return kept.decode("utf-8", "replace")

    def overflow_message(self) -> str:
        """Why a build whose output overflowed is refused, for its one error."""
        return (
            f"nvcc's diagnostics overflowed: more than {self.max_messages} messages or {self.max_bytes} bytes "
            f"({self.messages} messages, {self.read_bytes} bytes read when nvcc was stopped; the first are kept): "
            "fix the first ones, each repeated statement gets its own"
        )


def host_paths_removed(text: str, work: Path) -> str:
    """nvcc's output with the build directory's host path gone: a file in it is named as the candidate's own
    (`ptxas /tmp/kernelforge-build-x/work/tmpxft_..._candidate.ptx, line 3` says `ptxas candidate.ptx, line 3`)."""
    text = text.replace(f"{work}/", "").replace(str(work.parent), "kernelforge-build")
    return _INTERMEDIATE.sub("", text)


def tool_signal(log: str) -> int | None:
    """The signal nvcc says one of its tools died of (`nvcc error : 'cicc' died due to signal 9`), if any."""
    died = _DIED.search(log)
    return int(died.group(1)) if died else None


def parse_ptxas(log: str) -> dict[str, PtxasStats]:
    """Per-kernel stats from `-Xptxas -v` output; device functions (no "entry function" line) are left out."""
    entries: list[str] = []
    stats: dict[str, PtxasStats] = {}
    current: str | None = None
    for line in log.splitlines():
        if match := _PTX_ENTRY.search(line):
            current = match.group("name")
            entries.append(current)
        elif match := _PTX_PROPS.search(line):
            current = match.group("name")
        elif current is not None and (match := _PTX_FRAME.search(line)):
            entry = stats.setdefault(current, PtxasStats())
            entry.stack_frame_bytes = int(match.group("stack"))
            entry.spill_store_bytes = int(match.group("stores"))
            entry.spill_load_bytes = int(match.group("loads"))
        elif current is not None and (match := _PTX_USED.search(line)):
            entry = stats.setdefault(current, PtxasStats())
            rest = match.group("rest")
            entry.registers = int(match.group("regs"))
            entry.barriers = sum(int(n) for n in _PTX_BARRIERS.findall(rest))
            entry.shared_bytes = sum(int(n) for n in _PTX_SMEM.findall(rest))
            entry.constant_bytes = sum(int(n) for n in _PTX_CMEM.findall(rest))
    return {name: stats.get(name, PtxasStats()) for name in entries}


def _column(echo: str, caret: str, source_line: str | None) -> int | None:
    """1-based column from nvcc's echoed line and caret.

    The echo is the preprocessed line (`__device__` shows as `__attribute__((device))`) indented by
    two spaces, so the caret is mapped back by matching the rest of the line from the caret on.
    """
    offset = len(caret) - 1 - 2
    if offset < 0 or not echo.startswith("  "):
        return None
    tail = echo[2 + offset :]
    if source_line is None:
        return offset + 1
    original = source_line.replace("\t", " ").rstrip()
    return len(original) - len(tail) + 1 if tail and original.endswith(tail) else None


def parse_diagnostics(log: str, source: str) -> list[Diagnostic]:
    """Errors and warnings from nvcc, cudafe (EDG), the preprocessor and ptxas, in output order."""
    source_lines = source.splitlines()
    lines = log.splitlines()
    diagnostics: list[Diagnostic] = []

    def line_text(file: str, number: int) -> str | None:
        return source_lines[number - 1] if file == SOURCE_NAME and 0 < number <= len(source_lines) else None

    i = 0
    while i < len(lines):
        text = lines[i]
        i += 1
        if match := _EDG.match(text):
            file, number = match.group("file"), int(match.group("line"))
            severity: Literal["error", "warning"] = "warning" if match.group("sev") == "warning" else "error"
            message = match.group("msg")
            source_line = line_text(file, number)
            column: int | None = None
            # Indented lines follow until a blank line: message continuations, the echo and its caret.
            block: list[str] = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            carets = [k for k, b in enumerate(block) if _CARET.match(b)]
            if carets and carets[0] > 0:
                k = carets[0]
                column = _column(block[k - 1], block[k], source_line)
                source_line = source_line if source_line is not None else block[k - 1][2:]
                block = block[: k - 1] + block[k + 1 :]
            message = " ".join([message, *(b.strip() for b in block)])
            diagnostics.append(
                Diagnostic(
                    file=file, line=number, column=column, severity=severity, message=message, source_line=source_line
                )
            )
        elif match := _GCC.match(text):
            file, number = match.group("file"), int(match.group("line"))
            while i < len(lines) and _GCC_GUTTER.match(lines[i]):
                i += 1
            diagnostics.append(
                Diagnostic(
                    file=file,
                    line=number,
                    column=int(match.group("col")),
                    severity="warning" if match.group("sev") == "warning" else "error",
                    message=match.group("msg"),
                    source_line=line_text(file, number),
                )
            )
        elif match := _IN_HEADER.match(text):
            line = match.group("line")
            diagnostics.append(
                Diagnostic(
                    file=SOURCE_NAME if line else match.group("where"),
                    line=int(line) if line else None,
                    severity="warning" if match.group("sev") == "warning" else "error",
                    message=f"in {match.group('where')}: {match.group('msg')}",
                    source_line=line_text(SOURCE_NAME, int(line)) if line else None,
                )
            )
        elif match := _WITHHELD.match(text):
            line = match.group("line")
            diagnostics.append(
                Diagnostic(
                    file=SOURCE_NAME if line else "other",
                    line=int(line) if line else None,
                    severity="warning" if match.group("sev") == "warning" else "error",
                    message=f"{match.group('sev')} in an included file; its text is withheld "
                    f"(only messages about {SOURCE_NAME} are kept)",
                )
            )
        elif match := _TOOL.match(text):
            diagnostics.append(
                Diagnostic(
                    file=match.group("tool"),
                    severity="warning" if match.group("sev") == "warning" else "error",
                    message=f"{match.group('tool')}: {match.group('msg')}",
                )
            )
    return diagnostics


def candidate_messages(log: str, readable_roots: Sequence[Path] = ()) -> str:
    """nvcc's output reduced to what it says about the candidate and what ptxas and nvcc say.

    A message about another file (a toolkit header, or a host file that got in) is one line saying it was
    withheld, with the candidate line it was reached from when nvcc names one; its text, the lines it
    quotes and include traces are dropped. Unknown lines are dropped too. Under a readable root (the CUTLASS
    headers: public, read-only, what a candidate's template instantiates) the message's first line is kept, its
    file named from the root, so that a debugger reads the cause (a static_assert's text) at the candidate's
    line, not the instantiation backtrace below it.
    """
    kept: list[str] = []
    keep = True
    withheld: list[str] | None = None
    roots = [f"{root}/" for root in readable_roots]

    def close_withheld() -> None:
        if withheld is not None:
            severity = "warning" if ": warning" in withheld[0] else "error"
            reached = [m.group(1) for line in withheld if (m := _REACHED_FROM.search(line))]
            where = f", reached from line {reached[-1]}" if reached else ""
            header = next((withheld[0][len(root) :] for root in roots if withheld[0].startswith(root)), None)
            placed = _EDG.match(header) if header is not None else None
            if placed is not None:
                name = f"{placed.group('file')}({placed.group('line')})"
                message = placed.group("msg")[:HEADER_MESSAGE_CHARS]
                kept.append(f"kernelforge: {severity} in header {name}{where}: {message}")
            else:
                kept.append(f"kernelforge withheld: {severity} in another file{where}")

    for line in log.splitlines():
        if not line.strip() or line[0] in " \t":  # a message's continuation, echo or caret
            if keep:
                kept.append(line)
            elif withheld is not None:
                withheld.append(line)
            continue
        close_withheld()
        withheld = None
        keep = bool(
            _CANDIDATE.match(line) or _TOOL.match(line) or line.startswith("ptxas info") or _SUMMARY.match(line)
        )
        if keep:
            kept.append(line)
        elif _OTHER_FILE.match(line) and not line.startswith("In file included from"):
            withheld = [line]
    close_withheld()
    return "\n".join(kept) + ("\n" if kept else "")
