"""A run's events and commands: the search appends events its viewers follow, and polls the commands they queue.
A row that no longer parses comes back as an UnreadableRow in its place, never failing the whole read."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Literal, TypeVar

from pydantic import TypeAdapter, ValidationError

from kernelforge_tui.store.database import Database
from kernelforge_tui.store.records import first_problem
from kernelforge_tui.vocabulary.commands import EngineCommand
from kernelforge_tui.vocabulary.events import EngineEvent
from kernelforge_tui.vocabulary.runs import UnreadableRow

_EVENT = TypeAdapter[EngineEvent](EngineEvent)
_COMMAND = TypeAdapter[EngineCommand](EngineCommand)
_RAW_ROW = "id, CAST(kind AS BLOB) AS kind, CAST(json AS BLOB) AS json"
"""An event or command row as bytes: a row that is not even UTF-8 must not fail the whole query."""
T = TypeVar("T")


class MessageQueries(Database):
    """RunStore's event and command queries."""

    def append_event(self, event: EngineEvent) -> int:
        with self._tx() as c:
            cursor = c.execute("INSERT INTO events (kind, json) VALUES (?, ?)", (event.kind, event.model_dump_json()))
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def events_since(self, after_id: int, limit: int = 1000) -> list[tuple[int, EngineEvent | UnreadableRow]]:
        """Events with an id above `after_id`, oldest first (a follower keeps the last id it saw); a row that does
        not parse comes as an UnreadableRow, for the view to skip with a log line."""
        rows = self._read(f"SELECT {_RAW_ROW} FROM events WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit))
        return [(r["id"], _parsed(_EVENT.validate_json, "events", r)) for r in rows]

    def last_event(self, kind: str) -> EngineEvent | UnreadableRow | None:
        """The newest event of `kind` (the run's last budget standing, say), None where there is none."""
        rows = self._read(f"SELECT {_RAW_ROW} FROM events WHERE kind = ? ORDER BY id DESC LIMIT 1", (kind,))
        return _parsed(_EVENT.validate_json, "events", rows[0]) if rows else None

    def record_command(self, cmd: EngineCommand) -> int:
        """Queue a command for the search that owns this run (it polls them), from any process."""
        with self._tx() as c:
            cursor = c.execute(
                "INSERT INTO commands (kind, json, at) VALUES (?, ?, ?)", (cmd.kind, cmd.model_dump_json(), time.time())
            )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def pending_commands(self) -> list[tuple[int, EngineCommand | UnreadableRow]]:
        """Commands not yet applied, oldest first; a row that does not parse comes as an UnreadableRow, for the
        search to mark applied and log instead of applying."""
        rows = self._read(f"SELECT {_RAW_ROW} FROM commands WHERE applied = 0 ORDER BY id")
        return [(r["id"], _parsed(_COMMAND.validate_json, "commands", r)) for r in rows]

    def mark_applied(self, command_id: int) -> None:
        with self._tx() as c:
            c.execute("UPDATE commands SET applied = 1 WHERE id = ?", (command_id,))


def _parsed(
    validate: Callable[[bytes], T], table: Literal["events", "commands"], row: sqlite3.Row
) -> T | UnreadableRow:
    """A stored event or command, or an UnreadableRow in its place."""
    try:
        return validate(row["json"])
    except ValidationError as exc:
        kind = bytes(row["kind"]).decode(errors="replace")
        return UnreadableRow(table=table, row_id=row["id"], kind=kind, error=first_problem(exc))
