"""One run's open database: the connection, the lock that makes it thread-safe, write transactions and reads."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

from kernelforge_tui.store.errors import StoreError
from kernelforge_tui.store.files import DB_NAME, HINTS, named
from kernelforge_tui.store.schema import SCHEMA_VERSION, migrate, stored_version


class Database:
    """The connection under RunStore's queries. Thread-safe (one lock); every write commits before it returns."""

    def __init__(self, run_dir: Path, conn: sqlite3.Connection, readonly: bool, writer_fd: int | None = None) -> None:
        self.run_dir = run_dir
        self.readonly = readonly
        self._conn = conn
        self._writer_fd = writer_fd
        self._lock = threading.RLock()
        self.schema_version = SCHEMA_VERSION
        """The schema of the file: older only for a run of an older kernelforge opened readonly."""

    def verify(self) -> None:
        """Read every page once (`PRAGMA quick_check`, milliseconds for a recorded run): a damaged file is refused
        with one line when it is opened, not halfway through a search or a view."""
        problems = " ".join(" ".join(str(r[0]) for r in self._read("PRAGMA quick_check(3)")).split())
        if problems != "ok":
            raise StoreError(f"{self.run_dir / DB_NAME}: {problems[:200]}: {HINTS['SQLITE_CORRUPT']}")

    def close(self) -> None:
        """Close the database, then give up the writer lock (after the last commit)."""
        with self._lock:
            self._conn.close()
            if self._writer_fd is not None:
                os.close(self._writer_fd)
                self._writer_fd = None

    def backup(self, target: sqlite3.Connection) -> None:
        """Copy the whole database into `target` as of one commit (SQLite's online backup, safe beside a writer)."""
        with self._lock, named(self.run_dir / DB_NAME):
            self._conn.backup(target)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _version(self) -> int:
        with self._lock, named(self.run_dir / DB_NAME):
            return stored_version(self._conn)

    def _migrate(self) -> None:
        # WAL is recorded in the file: set here, after `open` checked that the file is a run (not on connecting,
        # which would write into any file it was pointed at, an empty one included).
        self._read("PRAGMA journal_mode=WAL")
        with self._tx() as c:
            migrate(c)

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: take the write lock up front, waiting up to busy_timeout)."""
        if self.readonly:
            raise StoreError("this store was opened readonly")
        with self._lock, named(self.run_dir / DB_NAME):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock, named(self.run_dir / DB_NAME):
            return list(self._conn.execute(sql, params).fetchall())
