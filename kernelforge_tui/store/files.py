"""The run's database file: finding it, connecting to it (read-write, or read-only with the immutable fallback), and
SQLite's errors about it as one line that names the file and says what to do."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from kernelforge_tui.store.errors import StoreError
from kernelforge_tui.store.lock import writer_live

DB_NAME = "run.sqlite"
BUSY_TIMEOUT_MS = 10_000

HINTS = {
    "SQLITE_CORRUPT": "the file is damaged: restore it from a copy, or delete the run",
    "SQLITE_NOTADB": "it is not a run database: restore it from a copy, or delete the run",
    "SQLITE_READONLY": "it cannot be written here: copy the run to a writable directory, or `kernelforge open` it",
    "SQLITE_CANTOPEN": "it cannot be opened here: check the directory's permissions",
    "SQLITE_BUSY": "another process holds it locked: try again",
    "SQLITE_FULL": "the disk is full: free some space, then resume the run",
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


def connect(path: Path, readonly: bool) -> sqlite3.Connection:
    """A connection to the database at `path` (rows as sqlite3.Row, foreign keys on), its errors named."""
    with named(path):
        if readonly:
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
