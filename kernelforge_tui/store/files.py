"""The run's database file: finding it, connecting to it (read-write, or read-only with the immutable fallback), and
SQLite's errors about it as one line that names the file and says what to do."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from kernelforge_tui.store.errors import StoreError
from kernelforge_tui.store.lock import writer_live

DB_NAME = "run.sqlite"
BUSY_TIMEOUT_MS = 10_000
EXAMPLE_MARK = "EXAMPLE"
"""A file in a run's directory marking the run as an example shipped with kernelforge: it opens read-only."""
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
"""The checkout's examples (in an editable install): every run under it opens read-only, marked or not."""

HINTS = {
    "SQLITE_CORRUPT": "the file is damaged: restore it from a copy, or delete the run",
    "SQLITE_NOTADB": "it is not a run database: restore it from a copy, or delete the run",
    "SQLITE_READONLY": (
        "it cannot be written here: copy the run (`kernelforge runs copy RUN DEST`), or `kernelforge open` it"
    ),
    "SQLITE_CANTOPEN": "it cannot be opened here: check the directory's permissions",
    "SQLITE_BUSY": "another process holds it locked: try again",
    "SQLITE_FULL": "the disk is full: free some space, then resume the run",
    "SQLITE_TOOBIG": (
        "one value of this write is over SQLite's limit for one string or blob, so nothing of the write was "
        "stored and the file is not damaged: lower the provider's limits.reply_bytes (an LLM reply is stored "
        "whole), then resume the run"
    ),
}
"""What to do about each SQLite error (by its primary name), for one-line messages."""


@contextlib.contextmanager
def named(path: Path) -> Iterator[None]:
    """SQLite's errors about the file as a StoreError that names it and says what to do: a damaged, unwritable or
    locked run is one line for the user, never a traceback. Errors of the calling code keep their traceback."""
    try:
        yield
    except (sqlite3.ProgrammingError, sqlite3.IntegrityError):
        raise
    except sqlite3.DatabaseError as exc:
        name = getattr(exc, "sqlite_errorname", "")
        hint = next((h for prefix, h in HINTS.items() if name.startswith(prefix)), HINTS["SQLITE_CORRUPT"])
        raise StoreError(f"{path}: {exc}: {hint}") from None


def db_file(run_dir: Path) -> Path:
    path = run_dir / DB_NAME
    if not path.is_file():
        raise StoreError(f"no run in {run_dir} ({DB_NAME} not found): list runs with `kernelforge runs`")
    return path


def copy_hint(run_dir: Path) -> str:
    """How to get a copy of a run that can be written (steered, resumed, profiled)."""
    return f"copy it to steer or continue it: `kernelforge runs copy {run_dir} DEST`, then use DEST"


def example_reason(run_dir: Path) -> str | None:
    """Why the run is an example that stays as shipped (marked with EXAMPLE_MARK, or inside the checkout's
    examples), with how to copy it; None for any other run."""
    marked = (run_dir / EXAMPLE_MARK).is_file()
    if not marked and not run_dir.resolve().is_relative_to(EXAMPLES_DIR):
        return None
    return f"run {run_dir} is an example shipped with kernelforge and opens read-only: {copy_hint(run_dir)}"


def read_only_reason(run_dir: Path) -> str | None:
    """Why the run in `run_dir` can never be written here (an example, or a store this user cannot write), with how
    to get a copy that can be; None when it can be written. What a view asks before offering to steer a run."""
    example = example_reason(run_dir)
    if example is not None:
        return example
    if os.access(run_dir, os.W_OK) and os.access(run_dir / DB_NAME, os.W_OK):
        return None
    return f"run {run_dir} cannot be written by this user: {copy_hint(run_dir)}"


def connect(path: Path, readonly: bool) -> sqlite3.Connection:
    """A connection to the database at `path` (rows as sqlite3.Row, foreign keys on), its errors named. An example's
    (`example_reason`) that no process writes is read `immutable`: no WAL index or lock is left beside it."""
    with named(path):
        if readonly and example_reason(path.parent) is not None and not writer_live(path.parent):
            conn = _sqlite(f"{path.resolve().as_uri()}?immutable=1")
        elif readonly:
            conn = _connect_readonly(path)
        else:
            conn = _sqlite(str(path))
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process crash
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys=ON")
    conn.row_factory = sqlite3.Row
    return conn


def _sqlite(target: str) -> sqlite3.Connection:
    return sqlite3.connect(
        target,
        uri=target.startswith("file:"),
        timeout=BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
    )


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """`mode=ro` follows a live writer through the WAL, but it needs the WAL index beside the file, which a directory
    this user cannot write (a read-only checkout of examples/runs) refuses. Then, if no writer holds the run's lock,
    the file cannot change while it is read, and `immutable=1` reads it with no WAL index and no locking. (Always
    immutable would miss a writer that starts later, and could read its checkpoints half-written.)"""
    uri = path.resolve().as_uri()
    conn = _sqlite(f"{uri}?mode=ro")
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # SQLite opens lazily: the WAL index is made here
    except sqlite3.OperationalError as exc:
        conn.close()
        if not getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
            raise
        if writer_live(path.parent):
            raise StoreError(
                f"{path}: a live process writes this run, and following it needs the WAL index beside it, which "
                f"this user cannot open ({exc}): follow it as a user who can write {path.parent}"
            ) from None
        conn = _sqlite(f"{uri}?immutable=1")
    return conn
