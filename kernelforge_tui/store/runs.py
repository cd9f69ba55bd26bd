"""RunStore: opening a run (create, open, resume) and its run row; the node and message queries it inherits."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from kernelforge_tui.atomic import replacing
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.store.card_path import recorded_card_dir, resolve_card_dir
from kernelforge_tui.store.errors import StoreError
from kernelforge_tui.store.files import DB_NAME, connect, db_file, example_reason, read_only_reason
from kernelforge_tui.store.llm import LlmQueries
from kernelforge_tui.store.lock import take_writer_lock, writer_live
from kernelforge_tui.store.messages import MessageQueries
from kernelforge_tui.store.nodes import NodeQueries
from kernelforge_tui.store.records import interval
from kernelforge_tui.store.schema import SCHEMA_VERSION
from kernelforge_tui.vocabulary.runs import RunInfo

M = TypeVar("M", bound=BaseModel)


class RunStore(NodeQueries, MessageQueries, LlmQueries):
    """The SQLite database of one run. Thread-safe (one lock); every write commits before it returns.

    A run has one writer, its search: `create` and `resume` take the run's writer lock and refuse a run that a live
    process writes. `open` never takes it: readonly for viewers, writable to steer a live run (commands, profiles).
    An example shipped with kernelforge (`files.example_reason`) is never written: it opens readonly only, without
    leaving a WAL index or a lock beside it, and `read_only_reason` says so (with how to copy it) to the views.
    """

    read_only_reason: str | None = None
    """Why this run can never be written here (an example, or a store this user cannot write), with how to copy
    it; None when it can be: what a view asks before offering to steer (pin, ban, export marks) or continue it."""

    # ---- opening ------------------------------------------------------------------------------------

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
        writer_fd = take_writer_lock(run_dir)
        try:
            path = run_dir / DB_NAME
            if path.exists():
                raise StoreError(f"{run_dir} already holds a run: resume it with --resume, or pick another --run-dir")
            with replacing(path, companions=("-wal", "-shm")) as tmp:
                building = cls(run_dir, connect(tmp, readonly=False), readonly=False)
                building._migrate()
                with building._tx() as c:
                    c.execute(
                        "INSERT INTO run (id, card_name, family, card_json, card_dir, backend, gpu_name, settings_json,"
                        " started_at, state, pid, host) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        (
                            run_dir.name,
                            card.spec.name,
                            card.spec.family,
                            card.spec.model_dump_json(),
                            recorded_card_dir(card.root, run_dir),
                            backend_name,
                            gpu_name,
                            settings.model_dump_json(),
                            time.time(),
                            "starting",
                            os.getpid(),
                            socket.gethostname(),
                        ),
                    )
                building.close()  # checkpoints the WAL into the file and removes it
            return cls(run_dir, connect(path, readonly=False), readonly=False, writer_fd=writer_fd)
        except BaseException:
            os.close(writer_fd)
            raise

    @classmethod
    def open(cls, run_dir: Path, readonly: bool = False) -> RunStore:
        """An existing run, without becoming its writer: `readonly` never writes (safe beside a live writer, never
        blocks it); writable is for steering a live run. The search itself opens its run with `resume`."""
        path = db_file(run_dir)
        example = example_reason(run_dir)
        if example is not None and not readonly:
            raise StoreError(example)
        store = cls(run_dir, connect(path, readonly), readonly)
        store.read_only_reason = read_only_reason(run_dir)
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
        db_file(run_dir)  # no lock file in a directory that holds no run
        example = example_reason(run_dir)
        if example is not None:  # before the lock: an example's directory is left as shipped
            raise StoreError(example)
        writer_fd = take_writer_lock(run_dir)
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
            best_speedup_interval=interval(top) if top else None,
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
        """The card directory the run was created from (a resume and a profile load the card from there), as a path
        here (`card_path.resolve_card_dir`)."""
        return resolve_card_dir(self.run_dir, self._read("SELECT card_dir FROM run")[0]["card_dir"])

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
