"""The run store: one SQLite database per run directory, holding everything the search knows.

Why SQLite in WAL mode: the search commits every node as it happens, so a `kill -9` loses at most the
candidates in flight; a second process (the TUI following a live run) reads while the search writes;
and a TUI in another process steers the run by writing commands the search polls. The schema carries a
version and a list of migrations, so old runs stay readable.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cards.store import Card
from kernelforge_tui.errors import BadInput
from kernelforge_tui.models.commands import EngineCommand
from kernelforge_tui.models.evaluation import Evaluation
from kernelforge_tui.models.events import EngineEvent
from kernelforge_tui.models.nodes import NodeOutcome, NodeRecord, NodeStats, NodeStatus, NodeView, ParamValue
from kernelforge_tui.models.profiles import NodeProfile
from kernelforge_tui.models.rewards import Reward
from kernelforge_tui.models.runs import RunInfo, RunListing, SkippedRun, UnreadableRow

DB_NAME = "run.sqlite"
BUSY_TIMEOUT_MS = 10_000
LOCK_NAME = "writer.lock"
"""The run's writer lock: `flock`ed by the one process that writes the run (the search), for that process's whole
life; the OS releases it when the process dies, `kill -9` included. It also holds who took it (WriterInfo)."""
LOCK_WAIT_S = 0.5
"""How long a new writer retries: a viewer's liveness probe holds a shared lock on the file for an instant."""

MIGRATIONS: list[str] = [
    # 1: the first schema.
    """
    CREATE TABLE run (
        id TEXT PRIMARY KEY,
        card_name TEXT NOT NULL,
        family TEXT NOT NULL,
        card_json TEXT NOT NULL,
        card_dir TEXT NOT NULL,
        backend TEXT NOT NULL,
        gpu_name TEXT NOT NULL,
        settings_json TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        active_seconds REAL NOT NULL DEFAULT 0,
        pid INTEGER,
        host TEXT
    );
    CREATE TABLE nodes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        parent INTEGER REFERENCES nodes(id),
        status TEXT NOT NULL,
        failure TEXT,
        reason TEXT NOT NULL DEFAULT '',
        mutation TEXT NOT NULL DEFAULT '',
        proposer TEXT NOT NULL DEFAULT '',
        params TEXT NOT NULL DEFAULT '{}',
        source TEXT NOT NULL,
        plan TEXT NOT NULL,
        latency REAL,
        speedup REAL,
        ceiling_share REAL,
        visits INTEGER NOT NULL DEFAULT 0,
        value REAL NOT NULL DEFAULT 0,
        banned INTEGER NOT NULL DEFAULT 0,
        pinned INTEGER NOT NULL DEFAULT 0,
        export INTEGER NOT NULL DEFAULT 0,
        hints TEXT NOT NULL DEFAULT '[]',
        attempts INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX nodes_parent ON nodes(parent);
    CREATE TABLE measurements (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node INTEGER NOT NULL REFERENCES nodes(id),
        evaluation TEXT NOT NULL,
        gpu_seconds REAL NOT NULL DEFAULT 0,
        at REAL NOT NULL
    );
    CREATE INDEX measurements_node ON measurements(node);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        json TEXT NOT NULL
    );
    CREATE TABLE commands (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        json TEXT NOT NULL,
        applied INTEGER NOT NULL DEFAULT 0,
        at REAL NOT NULL
    );
    CREATE TABLE profiles (
        node INTEGER PRIMARY KEY REFERENCES nodes(id),
        json TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 2: the reward of each node with every term (engine.reward.Reward as JSON).
    """
    ALTER TABLE nodes ADD COLUMN reward_json TEXT;
    """,
    # 3: each speedup's 95% interval, and the best as promoted (beyond the noise, engine.promotion).
    """
    ALTER TABLE nodes ADD COLUMN speedup_low REAL;
    ALTER TABLE nodes ADD COLUMN speedup_high REAL;
    ALTER TABLE run ADD COLUMN best_node INTEGER REFERENCES nodes(id);
    """,
]
"""Migration i (0-based) takes the schema from version i to i + 1. Append; never edit a released one."""

SCHEMA_VERSION = len(MIGRATIONS)

_EVENT = TypeAdapter[EngineEvent](EngineEvent)
_COMMAND = TypeAdapter[EngineCommand](EngineCommand)
_RAW_ROW = "id, CAST(kind AS BLOB) AS kind, CAST(json AS BLOB) AS json"
"""An event or command row as bytes: a row that is not even UTF-8 must not fail the whole query."""
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class StoreError(BadInput):
    """A run directory that cannot be opened or used as asked: the message says why and what to do."""


class UnknownNode(StoreError, LookupError):
    """A node id the run does not hold."""


class UnreadableRecord(StoreError):
    """A stored record (a profile) that no longer reads as its model: written by another kernelforge version."""


class WriterInfo(BaseModel):
    """Who holds a run's writer lock, as written into the lock file: for the message that refuses a second writer."""

    pid: int
    host: str
    since: float

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} since {since}"


def _take_writer_lock(run_dir: Path) -> int:
    """Become the run's one writer: the locked file descriptor, to keep open for the process's life (it is not
    inherited by subprocesses: Python opens it close-on-exec). A run already written by a live process is refused."""
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(
            f"cannot take the writer lock in {run_dir} ({exc.strerror}): a run is written only where this user can "
            f"write (copy a read-only run elsewhere to resume it; `kernelforge open {run_dir}` views it as it is)"
        ) from None
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                holder = _lock_holder(fd)
                os.close(fd)
                raise StoreError(
                    f"run {run_dir} is being written by {holder} (lock {path}): a run has one writer; stop that one "
                    f"first, or follow it read-only with `kernelforge open {run_dir}`"
                ) from None
            time.sleep(0.02)
        except OSError as exc:
            os.close(fd)
            raise StoreError(
                f"cannot lock {path} ({exc.strerror}): keep runs on a file system with file locks (a local disk)"
            ) from None
    info = WriterInfo(pid=os.getpid(), host=socket.gethostname(), since=time.time())
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.model_dump_json().encode(), 0)
    return fd


def _lock_holder(fd: int) -> str:
    """The holder as its lock file says, or a plain phrase while it is still writing it."""
    try:
        return WriterInfo.model_validate_json(os.pread(fd, 4096, 0)).describe()
    except (OSError, ValidationError):
        return "another process"


def writer_live(run_dir: Path) -> bool:
    """Whether a process holds the run's writer lock now: probed with a shared lock, released at once."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return False  # no writer of this kernelforge ever opened it (a shipped example run)
    except OSError:
        return True  # cannot tell: assume a writer, the cautious answer for both callers
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # held by a writer (or locks unsupported here: cannot tell, so assume one)
        return True
    finally:
        os.close(fd)
    return False


_HINTS = {
    "SQLITE_CORRUPT": "the file is damaged: restore it from a copy, or delete the run",
    "SQLITE_NOTADB": "it is not a run database: restore it from a copy, or delete the run",
    "SQLITE_READONLY": "it cannot be written here: copy the run to a writable directory, or `kernelforge open` it",
    "SQLITE_CANTOPEN": "it cannot be opened here: check the directory's permissions",
    "SQLITE_BUSY": "another process holds it locked: try again",
    "SQLITE_FULL": "the disk is full: free some space, then resume the run",
}
"""What to do about each SQLite error (by its primary name), for one-line messages."""


@contextlib.contextmanager
def _named(path: Path) -> Iterator[None]:
    """SQLite's errors about the file as a StoreError that names it and says what to do: a damaged, unwritable or
    locked run is one line for the user, never a traceback. Errors of the calling code keep their traceback."""
    try:
        yield
    except (sqlite3.ProgrammingError, sqlite3.IntegrityError):
        raise
    except sqlite3.DatabaseError as exc:
        name = getattr(exc, "sqlite_errorname", "")
        hint = next((h for prefix, h in _HINTS.items() if name.startswith(prefix)), _HINTS["SQLITE_CORRUPT"])
        raise StoreError(f"{path}: {exc}: {hint}") from None


def _sqlite(target: str) -> sqlite3.Connection:
    return sqlite3.connect(
        target, uri=target.startswith("file:"), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
        check_same_thread=False,
    )  # fmt: skip


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


def _db_file(run_dir: Path) -> Path:
    path = run_dir / DB_NAME
    if not path.is_file():
        raise StoreError(f"no run in {run_dir} ({DB_NAME} not found): list runs with `kernelforge runs`")
    return path


def _parsed(
    validate: Callable[[bytes], T], table: Literal["events", "commands"], row: sqlite3.Row
) -> T | UnreadableRow:
    """A stored event or command, or an UnreadableRow in its place."""
    try:
        return validate(row["json"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        error = f"{where}: {first['msg']}" if where else str(first["msg"])
        kind = bytes(row["kind"]).decode(errors="replace")
        return UnreadableRow(table=table, row_id=row["id"], kind=kind, error=error)


class RunStore:
    """The SQLite database of one run. Thread-safe (one lock); every write commits before it returns.

    A run has one writer, its search: `create` and `resume` take the run's writer lock and refuse a run that a live
    process writes. `open` never takes it: readonly for viewers, writable to steer a live run (commands, profiles).
    """

    def __init__(self, run_dir: Path, conn: sqlite3.Connection, readonly: bool, writer_fd: int | None = None) -> None:
        self.run_dir = run_dir
        self.readonly = readonly
        self._conn = conn
        self._writer_fd = writer_fd
        self._lock = threading.RLock()
        self.schema_version = SCHEMA_VERSION
        """The schema of the file: older only for a run of an older kernelforge opened readonly."""

    # ---- opening ------------------------------------------------------------------------------------

    @staticmethod
    def _connect(path: Path, readonly: bool) -> sqlite3.Connection:
        with _named(path):
            if readonly:
                conn = _connect_readonly(path)
            else:
                conn = _sqlite(str(path))
                conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process crash
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys=ON")
        conn.row_factory = sqlite3.Row
        return conn

    @classmethod
    def create(cls, run_dir: Path, card: Card, backend_name: str, gpu_name: str, settings: BaseModel) -> RunStore:
        """A new run in `run_dir` (created; it must not already hold a run), with this process as its writer.

        The database is built under a temporary name and renamed into place, so a reader polling the
        directory (the TUI, `kernelforge runs`) never sees a half-created run.
        """
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the run directory {run_dir} ({exc.strerror}): pick another one") from None
        writer_fd = _take_writer_lock(run_dir)
        try:
            path = run_dir / DB_NAME
            if path.exists():
                raise StoreError(f"{run_dir} already holds a run: resume it with --resume, or pick another --run-dir")
            tmp = run_dir / f".{DB_NAME}.{os.getpid()}.tmp"
            for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
                leftover.unlink(missing_ok=True)
            building = cls(run_dir, cls._connect(tmp, readonly=False), readonly=False)
            building._migrate()
            with building._tx() as c:
                c.execute(
                    "INSERT INTO run (id, card_name, family, card_json, card_dir, backend, gpu_name, settings_json,"
                    " started_at, state, pid, host) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_dir.name, card.spec.name, card.spec.family, card.spec.model_dump_json(),
                     str(card.root.resolve()), backend_name, gpu_name, settings.model_dump_json(), time.time(),
                     "starting", os.getpid(), socket.gethostname()),
                )  # fmt: skip
            building.close()  # checkpoints the WAL into the file and removes it
            os.replace(tmp, path)
            return cls(run_dir, cls._connect(path, readonly=False), readonly=False, writer_fd=writer_fd)
        except BaseException:
            os.close(writer_fd)
            raise

    @classmethod
    def open(cls, run_dir: Path, readonly: bool = False) -> RunStore:
        """An existing run, without becoming its writer: `readonly` never writes (safe beside a live writer, never
        blocks it); writable is for steering a live run. The search itself opens its run with `resume`."""
        path = _db_file(run_dir)
        store = cls(run_dir, cls._connect(path, readonly), readonly)
        try:
            version = store._version()
            if version == 0:  # SQLite reads a 0-byte file as an empty database
                raise StoreError(
                    f"{path} is not a run database (it is empty, or holds no kernelforge schema): "
                    "restore it from a copy, or delete the run"
                )
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{path} has schema version {version}, newer than this kernelforge reads ({SCHEMA_VERSION}): "
                    "upgrade kernelforge"
                )
            if readonly:  # never written, so never migrated: an older schema is read as it is
                store.schema_version = version
            else:
                store._migrate()
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def resume(cls, run_dir: Path) -> RunStore:
        """An existing run with this process as its one writer (`optimize --resume`): refused while another process
        writes it, and read whole first (`verify`), so a damaged file stops the resume before the search starts."""
        _db_file(run_dir)  # no lock file in a directory that holds no run
        writer_fd = _take_writer_lock(run_dir)
        try:
            store = cls.open(run_dir)
        except BaseException:
            os.close(writer_fd)
            raise
        store._writer_fd = writer_fd
        try:
            store.verify()
        except BaseException:
            store.close()
            raise
        return store

    def verify(self) -> None:
        """Read every page once (`PRAGMA quick_check`, milliseconds for a recorded run): a damaged file is refused
        with one line when it is opened, not halfway through a search or a view."""
        problems = " ".join(" ".join(str(r[0]) for r in self._read("PRAGMA quick_check(3)")).split())
        if problems != "ok":
            raise StoreError(f"{self.run_dir / DB_NAME}: {problems[:200]}: {_HINTS['SQLITE_CORRUPT']}")

    def close(self) -> None:
        """Close the database, then give up the writer lock (after the last commit)."""
        with self._lock:
            self._conn.close()
            if self._writer_fd is not None:
                os.close(self._writer_fd)
                self._writer_fd = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _version(self) -> int:
        if not self._read("SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'"):
            return 0
        found = self._read("SELECT version FROM schema_version")
        return int(found[0][0]) if found else 0

    def _migrate(self) -> None:
        # WAL is recorded in the file: set here, after `open` checked that the file is a run (not on connecting,
        # which would write into any file it was pointed at, an empty one included).
        self._read("PRAGMA journal_mode=WAL")
        with self._tx() as c:
            c.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            for script in MIGRATIONS[self._version() :]:
                for statement in script.split(";"):
                    if statement.strip():
                        c.execute(statement)
            c.execute("DELETE FROM schema_version")
            c.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: take the write lock up front, waiting up to busy_timeout)."""
        if self.readonly:
            raise StoreError("this store was opened readonly")
        with self._lock, _named(self.run_dir / DB_NAME):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock, _named(self.run_dir / DB_NAME):
            return list(self._conn.execute(sql, params).fetchall())

    # ---- the run ------------------------------------------------------------------------------------

    def run_info(self) -> RunInfo:
        run = self._read("SELECT * FROM run")
        if not run:
            raise StoreError(f"{self.run_dir} has no run row: the run was never created completely")
        r = run[0]
        counts = self._read(
            "SELECT COUNT(*) AS n, SUM(status = 'failed') AS failed,"
            " SUM(status IN ('proposed', 'built')) AS flying FROM nodes"
        )[0]
        best = self._read(self._best_query())
        gpu = self._read("SELECT COALESCE(SUM(gpu_seconds), 0) AS s FROM measurements")[0]
        state = r["state"]
        if state != "finished" and self._writer_fd is None and not writer_live(self.run_dir):
            state = "interrupted"  # its writer died: the OS released the writer lock (no pid that can be reused)
        top = best[0] if best else None
        return RunInfo(
            run_id=r["id"],
            run_dir=self.run_dir,
            card_name=r["card_name"],
            family=r["family"],
            gpu_name=r["gpu_name"],
            backend=r["backend"],
            state=state,
            reason=r["reason"],
            started_at=r["started_at"],
            ended_at=r["ended_at"],
            best_node_id=top["id"] if top else None,
            best_speedup=top["speedup"] if top else None,
            best_speedup_interval=_interval(top) if top else None,
            best_latency_us=top["latency"] if top else None,
            best_ceiling_share=top["ceiling_share"] if top else None,
            node_count=counts["n"] or 0,
            failure_count=counts["failed"] or 0,
            in_flight_count=counts["flying"] or 0,
            active_seconds=r["active_seconds"],
            gpu_seconds=gpu["s"],
        )

    def _best_query(self) -> str:
        """The promoted best (schema 3); in older runs, which promoted the fastest, the fastest measured node."""
        columns = "id, speedup, latency, ceiling_share"
        if self.schema_version >= 3:
            promoted = self._read("SELECT best_node FROM run")[0]["best_node"]
            if promoted is not None:
                return f"SELECT {columns}, speedup_low, speedup_high FROM nodes WHERE id = {int(promoted)}"
        return (
            f"SELECT {columns}, NULL AS speedup_low, NULL AS speedup_high FROM nodes"
            " WHERE status IN ('verified','timed','profiled') AND speedup IS NOT NULL"
            " ORDER BY speedup DESC, id ASC LIMIT 1"
        )

    def card_dir(self) -> Path:
        """The card directory the run was created from (a resume and a profile load the card from there)."""
        return Path(self._read("SELECT card_dir FROM run")[0]["card_dir"])

    def settings(self, model: type[M]) -> M:
        """The settings the run records, read as `model` (the engine's RunSettings: the store does not know it)."""
        return model.model_validate_json(self._read("SELECT settings_json FROM run")[0]["settings_json"])

    def set_settings(self, settings: BaseModel) -> None:
        """Record new settings (a resumed run given new budgets)."""
        with self._tx() as c:
            c.execute("UPDATE run SET settings_json = ?", (settings.model_dump_json(),))

    def set_state(self, state: str, reason: str = "", ended: bool = False) -> None:
        """The run's state; a live state also records this process as the run's owner."""
        with self._tx() as c:
            c.execute(
                "UPDATE run SET state = ?, reason = ?, ended_at = ?, pid = ?, host = ?",
                (state, reason, time.time() if ended else None, os.getpid(), socket.gethostname()),
            )

    def add_active_seconds(self, seconds: float) -> None:
        with self._tx() as c:
            c.execute("UPDATE run SET active_seconds = active_seconds + ?", (seconds,))

    # ---- nodes --------------------------------------------------------------------------------------

    def add_node(
        self,
        parent_id: int | None,
        source: str,
        plan: LaunchPlan,
        mutation: str = "",
        proposer: str = "",
        params: dict[str, ParamValue] | None = None,
    ) -> NodeView:
        """A new node, proposed (not yet built nor measured)."""
        now = time.time()
        with self._tx() as c:
            cursor = c.execute(
                "INSERT INTO nodes (parent, status, mutation, proposer, params, source, plan, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    parent_id,
                    NodeStatus.PROPOSED,
                    mutation,
                    proposer,
                    json.dumps(params or {}),
                    source,
                    plan.model_dump_json(),
                    now,
                    now,
                ),
            )
            node_id = cursor.lastrowid
        assert node_id is not None
        return self.node(node_id)

    def _set(self, node_id: int, sql: str, *values: object) -> NodeView:
        """One node's columns (`sql`: the assignments, written here, never from input); returns the new view."""
        with self._tx() as c:
            c.execute(f"UPDATE nodes SET {sql}, updated_at = ? WHERE id = ?", (*values, time.time(), node_id))
        return self.node(node_id)

    def set_status(self, node_id: int, status: NodeStatus) -> NodeView:
        """A step on the way (built, or profiled after it was timed); outcomes go through `finish_node`."""
        return self._set(node_id, "status = ?", status)

    def queue_node(self, node_id: int, attempts: int) -> NodeView:
        """The node handed to the pipeline (again, on a resume): proposed, and how many times it was handed."""
        return self._set(node_id, "status = ?, attempts = ?", NodeStatus.PROPOSED, attempts)

    def set_hints(self, node_id: int, hints: Sequence[str]) -> NodeView:
        return self._set(node_id, "hints = ?", json.dumps(list(hints)))

    def set_banned(self, node_id: int, banned: bool) -> NodeView:
        return self._set(node_id, "banned = ?", banned)

    def set_pinned(self, node_id: int, pinned: bool) -> NodeView:
        return self._set(node_id, "pinned = ?", pinned)

    def set_export(self, node_id: int, export: bool) -> NodeView:
        return self._set(node_id, "export = ?", export)

    def finish_node(
        self, node_id: int, evaluation: Evaluation, outcome: NodeOutcome, stats: Mapping[int, NodeStats]
    ) -> None:
        """A node's outcome, its measurement and the statistics it moved (its ancestors'), in one transaction."""
        gpu_seconds = evaluation.result.gpu_seconds if evaluation.result else 0.0
        reward = outcome.reward.model_dump_json() if outcome.reward is not None else None
        now = time.time()
        with self._tx() as c:
            c.execute(
                "INSERT INTO measurements (node, evaluation, gpu_seconds, at) VALUES (?,?,?,?)",
                (node_id, evaluation.model_dump_json(), gpu_seconds, now),
            )
            c.execute(
                "UPDATE nodes SET status = ?, failure = ?, reason = ?, latency = ?, speedup = ?, speedup_low = ?,"
                " speedup_high = ?, ceiling_share = ?, reward_json = ?, updated_at = ? WHERE id = ?",
                (
                    outcome.status,
                    outcome.failure,
                    outcome.reason,
                    outcome.latency_us,
                    outcome.speedup,
                    *(outcome.speedup_interval or (None, None)),
                    outcome.ceiling_share,
                    reward,
                    now,
                    node_id,
                ),
            )
            if outcome.best:
                c.execute("UPDATE run SET best_node = ?", (node_id,))
            self._save_stats(c, stats)

    def save_rewards(self, rewards: Mapping[int, Reward], stats: Mapping[int, NodeStats]) -> None:
        """New rewards (a profile arrived and rescored nodes) and the statistics they moved, in one transaction."""
        now = time.time()
        with self._tx() as c:
            for node_id, reward in rewards.items():
                c.execute(
                    "UPDATE nodes SET reward_json = ?, updated_at = ? WHERE id = ?",
                    (reward.model_dump_json(), now, node_id),
                )
            self._save_stats(c, stats)

    @staticmethod
    def _save_stats(c: sqlite3.Connection, stats: Mapping[int, NodeStats]) -> None:
        for node_id, s in stats.items():
            c.execute("UPDATE nodes SET visits = ?, value = ? WHERE id = ?", (s.visits, s.value, node_id))

    def _view(self, r: sqlite3.Row) -> NodeView:
        return NodeView(
            id=r["id"],
            parent_id=r["parent"],
            status=r["status"],
            failure=r["failure"],
            reason=r["reason"],
            mutation=r["mutation"],
            proposer=r["proposer"],
            latency_us=r["latency"],
            speedup=r["speedup"],
            speedup_interval=_interval(r),
            ceiling_share=r["ceiling_share"],
            visits=r["visits"],
            value=r["value"],
            banned=bool(r["banned"]),
            pinned=bool(r["pinned"]),
            export=bool(r["export"]),
            created_at=r["created_at"],
            profiled=bool(r["profiled"]),
            reward_total=r["reward_total"],
            reward_note=r["reward_note"] or "",
        )

    def _view_columns(self) -> str:
        """The columns of a NodeView; a run of schema 1 (readonly) has no rewards."""
        reward = (
            "json_extract(reward_json, '$.total') AS reward_total,"
            " json_extract(reward_json, '$.explanation') AS reward_note"
            if self.schema_version >= 2
            else "NULL AS reward_total, NULL AS reward_note"
        )
        interval = (
            "speedup_low, speedup_high" if self.schema_version >= 3 else "NULL AS speedup_low, NULL AS speedup_high"
        )
        return (
            "id, parent, status, failure, reason, mutation, proposer, latency, speedup, ceiling_share, visits, value,"
            " banned, pinned, export, created_at,"
            " EXISTS (SELECT 1 FROM profiles p WHERE p.node = nodes.id) AS profiled, " + reward + ", " + interval
        )

    def nodes(self) -> list[NodeView]:
        """Every node, in id order (a parent always comes before its children)."""
        return [self._view(r) for r in self._read(f"SELECT {self._view_columns()} FROM nodes ORDER BY id")]

    def node(self, node_id: int) -> NodeView:
        rows = self._read(f"SELECT {self._view_columns()} FROM nodes WHERE id = ?", (node_id,))
        if not rows:
            raise self._unknown(node_id)
        return self._view(rows[0])

    def _unknown(self, node_id: int) -> UnknownNode:
        return UnknownNode(f"no node {node_id} in run {self.run_dir.name}")

    def node_source(self, node_id: int) -> tuple[str, LaunchPlan]:
        rows = self._read("SELECT source, plan FROM nodes WHERE id = ?", (node_id,))
        if not rows:
            raise self._unknown(node_id)
        return rows[0]["source"], LaunchPlan.model_validate_json(rows[0]["plan"])

    _RECORDS = "SELECT n.*, (SELECT MAX(m.id) FROM measurements m WHERE m.node = n.id) AS last_m FROM nodes n"

    def node_records(self) -> list[NodeRecord]:
        """Every node in full, in id order, with the id of its latest measurement."""
        return [_record(r) for r in self._read(self._RECORDS + " ORDER BY id")]

    def node_record(self, node_id: int) -> NodeRecord:
        """One node in full: source, plan, params, hints and its reward with every term."""
        rows = self._read(self._RECORDS + " WHERE n.id = ?", (node_id,))
        if not rows:
            raise self._unknown(node_id)
        return _record(rows[0])

    def evaluation(self, node_id: int) -> Evaluation | None:
        """The node's latest whole Evaluation (build, checks, timing), or None before it was measured."""
        rows = self._read("SELECT evaluation FROM measurements WHERE node = ? ORDER BY id DESC LIMIT 1", (node_id,))
        if not rows:
            return None
        try:
            return Evaluation.model_validate_json(rows[0]["evaluation"])
        except ValidationError:
            return None

    # ---- events and commands ------------------------------------------------------------------------

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

    # ---- profiles -----------------------------------------------------------------------------------

    def save_profile(self, node_id: int, profile: NodeProfile) -> None:
        """The node's profile (a newer one replaces it)."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO profiles (node, json, at) VALUES (?, ?, ?)"
                " ON CONFLICT(node) DO UPDATE SET json = excluded.json, at = excluded.at",
                (node_id, profile.model_dump_json(), time.time()),
            )

    def profile(self, node_id: int) -> NodeProfile | None:
        """The node's saved profile, or None; UnreadableRecord when it no longer reads as a NodeProfile."""
        rows = self._read("SELECT json FROM profiles WHERE node = ?", (node_id,))
        if not rows:
            return None
        try:
            return NodeProfile.model_validate_json(rows[0]["json"])
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise UnreadableRecord(
                f"node {node_id}'s profile does not read as a profile of this kernelforge: "
                f"{exc.error_count()} problem(s), first {where + ': ' if where else ''}{first['msg']}"
            ) from None

    def profiled_ids(self) -> set[int]:
        """The nodes with a saved profile."""
        return {int(r["node"]) for r in self._read("SELECT node FROM profiles")}


def _interval(r: sqlite3.Row) -> tuple[float, float] | None:
    low, high = r["speedup_low"], r["speedup_high"]
    return (low, high) if low is not None and high is not None else None


def _record(r: sqlite3.Row) -> NodeRecord:
    return NodeRecord(
        id=r["id"],
        parent_id=r["parent"],
        status=r["status"],
        failure=r["failure"],
        reason=r["reason"],
        mutation=r["mutation"],
        proposer=r["proposer"],
        params=json.loads(r["params"]),
        source=r["source"],
        plan=LaunchPlan.model_validate_json(r["plan"]),
        latency_us=r["latency"],
        speedup=r["speedup"],
        ceiling_share=r["ceiling_share"],
        banned=bool(r["banned"]),
        pinned=bool(r["pinned"]),
        export=bool(r["export"]),
        hints=json.loads(r["hints"]),
        attempts=r["attempts"],
        last_measurement=r["last_m"],
        reward=_reward(r["reward_json"]) if "reward_json" in r.keys() else None,  # noqa: SIM118 (Row: keys)
    )


def _reward(text: str | None) -> Reward | None:
    """A stored reward, or None where there is none or it no longer parses (an older format)."""
    if text is None:
        return None
    try:
        return Reward.model_validate_json(text)
    except ValidationError:
        return None


def runs_root() -> Path:
    """Where runs live by default: `<data dir>/runs/<run-id>`."""
    from kernelforge_tui.config import data_dir

    return data_dir() / "runs"


def new_run_dir(card_name: str, root: Path | None = None) -> Path:
    """A fresh run directory name: `<UTC time>-<card name>` (made unique with a counter)."""
    base = root or runs_root()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    candidate = base / f"{stamp}-{card_name}"
    counter = 2
    while candidate.exists():
        candidate = base / f"{stamp}-{card_name}-{counter}"
        counter += 1
    return candidate


def resolve_run(run: str, root: Path | None = None) -> Path:
    """A run given as a directory path or as a run id under the runs root."""
    path = Path(run).expanduser()
    if (path / DB_NAME).is_file():
        return path
    under = (root or runs_root()) / run
    if (under / DB_NAME).is_file():
        return under
    raise StoreError(f"no run {run!r} (neither a run directory nor an id under {root or runs_root()})")


def list_runs(root: Path | None = None) -> RunListing:
    """Every readable run under `root` (default: the runs root), newest first, and the ones that could not be read."""
    base = root or runs_root()
    listing = RunListing(runs=[], skipped=[])
    if not base.is_dir():
        return listing
    for db in base.glob(f"*/{DB_NAME}"):
        try:
            with RunStore.open(db.parent, readonly=True) as store:
                listing.runs.append(store.run_info())
        except (StoreError, ValidationError) as exc:
            reason = str(exc) if isinstance(exc, StoreError) else f"unreadable run row: {exc.errors()[0]['msg']}"
            listing.skipped.append(SkippedRun(run_dir=db.parent, reason=reason))
    listing.runs.sort(key=lambda info: info.started_at, reverse=True)
    return listing
