"""How every command reports a failure: one line (or a JSON object with --json) and the exit code of its type; and
what a command does when the reader of its output goes away (`kernelforge runs --json | head`)."""

from __future__ import annotations

import json
import os
import select
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kernelforge_tui.errors import BadInput, KernelForgeError, NoGpu
from kernelforge_tui.gpu.ncu.run import ProfileError

EXIT_OK, EXIT_FAILED = 0, 1
PIPED_WIDTH = 100_000
"""The console's width when standard output is not a terminal and COLUMNS is not set: tables keep their columns'
full widths and lines are not wrapped, so `kernelforge runs | grep` sees whole names (a terminal's own width
applies on a terminal)."""
EXIT_READER_GONE = 141
"""128 + SIGPIPE: what a shell reports for a tool whose reader closed the pipe (`set -o pipefail` sees it)."""


def make_console() -> Console:
    """The console every command prints through: the terminal's width on a terminal, no width limit in a pipe."""
    console = Console(stderr=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        return Console(stderr=False, width=PIPED_WIDTH)
    return console


def fitted_table(
    title: str, columns: dict[str, list[str]], dropped_first: tuple[str, ...], console: Console
) -> tuple[Table, list[str]]:
    """A table of `columns` (cells in markup) that fits the console's width without cutting a word: columns wrap at
    spaces down to their longest word, the first (the one that names a row) never wraps, and columns are left out in
    the order of `dropped_first` while it still does not fit. The table and the columns left out."""
    shown = list(columns)
    left_out: list[str] = []
    while True:
        texts = {name: [Text.from_markup(cell) for cell in columns[name]] for name in shown}
        widest = {name: max([len(name), *(t.cell_len for t in texts[name])]) for name in shown}
        words = {
            name: max(len(w) for t in [Text(name), *texts[name]] for w in [*t.plain.split(), ""]) for name in shown
        }
        words[shown[0]] = widest[shown[0]]
        widths = dict(widest)
        room = console.width - (3 * len(shown) + 1)  # each column's padding and border, and the last border
        while sum(widths.values()) > room and any(widths[n] > words[n] for n in shown):
            name = max(shown, key=lambda n: widths[n] - words[n])
            widths[name] -= 1
        droppable = [name for name in dropped_first if name in shown]
        if sum(widths.values()) <= room or not droppable:
            table = Table(title=title)
            for name in shown:
                table.add_column(name, width=widths[name], no_wrap=name == shown[0])
            for row in zip(*(texts[name] for name in shown), strict=True):
                table.add_row(*row)
            return table, left_out
        shown.remove(droppable[0])
        left_out.append(droppable[0])


def fail(console: Console, as_json: bool, kind: str, message: str, code: int) -> int:
    if as_json:
        print(json.dumps({"ok": False, "error": kind, "message": message}))
    else:
        console.print(f"[red bold]error:[/] {escape(message)}", soft_wrap=True)  # one line, also when piped
    return code


def error_kind(exc: KernelForgeError) -> str:
    """The `error` field of a --json failure: what kind of problem, for scripts to branch on."""
    if isinstance(exc, ProfileError):
        return f"profile-{exc.kind}"
    if isinstance(exc, NoGpu):
        return "no-gpu"
    if isinstance(exc, BadInput):
        return "bad-input"
    return "failed"


def stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (Linux reports POLLERR on its write end), so that
    a BrokenPipeError from anything else (a worker's pipe) is not mistaken for `| head` and keeps its traceback."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by an object without a descriptor (tests), or closed
        return False
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def reader_gone() -> int:
    """End quietly: what is still buffered for standard output goes to /dev/null (so Python's exit flush raises no
    second BrokenPipeError), and the exit code says the output was cut."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_READER_GONE
