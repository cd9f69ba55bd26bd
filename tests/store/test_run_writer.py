"""One writer per run, damaged stores and rows, read-only directories: each a clear StoreError, never a traceback.

The writer lock is tried with real processes (a holder in a subprocess, then `kill -9`). Read-only directories are
tried as an unprivileged user: root ignores file modes, so when the tests run as root the reader drops to `nobody`
(after its imports, which live under root's home) in a subprocess.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from kernelforge_tui.cards import load_card
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import DB_NAME, RunStore, StoreError, list_runs
from kernelforge_tui.vocabulary.commands import Pause, Stop
from kernelforge_tui.vocabulary.events import LogLine
from kernelforge_tui.vocabulary.runs import UnreadableRow

ROOT = Path(__file__).resolve().parents[2]
CARD = ROOT / "examples" / "cards" / "vector_add_f32"
EXAMPLE_RUNS = sorted(p.parent for p in (ROOT / "examples" / "runs").glob(f"*/{DB_NAME}"))
NOBODY = 65534


class NoSettings(BaseModel):
    """A run's recorded settings, for tests that need none."""


def new_run(run_dir: Path) -> RunStore:
    return RunStore.create(run_dir, load_card(CARD), "simulated", "simulated (no GPU)", NoSettings())


HOLDER = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from tests.store.test_run_writer import new_run
    from kernelforge_tui.store import RunStore
    run_dir = Path(sys.argv[1])
    store = RunStore.resume(run_dir) if (run_dir / "run.sqlite").exists() else new_run(run_dir)
    store.set_state("running")
    # A child that outlives the holder: the lock's descriptor must not leak into it (it is close-on-exec).
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], close_fds=False)
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process writing a run (the run's writer), with a child of its own; both killed at the end."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip().isdigit(), process.communicate()[1]
    child = int(line)
    try:
        yield process, run_dir
    finally:
        process.kill()
        process.wait()
        os.kill(child, 9)


def test_a_second_writer_is_refused_naming_the_holder(holder: tuple[subprocess.Popen[str], Path]) -> None:
    process, run_dir = holder
    with pytest.raises(StoreError) as refused:
        RunStore.resume(run_dir)
    message = str(refused.value)
    assert f"pid {process.pid} on {socket.gethostname()} since " in message and "\n" not in message
    assert "kernelforge open" in message and refused.value.exit_code == 2
    with pytest.raises(StoreError, match=f"pid {process.pid}"):
        new_run(run_dir)  # creating over it is refused the same way
    with RunStore.open(run_dir, readonly=True) as viewer:  # a viewer still follows it
        assert viewer.run_info().state == "running"
    with RunStore.open(run_dir) as steering:  # and a view may still steer it through commands
        steering.record_command(Pause())


def test_a_second_optimize_is_refused_in_one_line(holder: tuple[subprocess.Popen[str], Path]) -> None:
    process, run_dir = holder
    command = ["optimize", "--resume", str(run_dir), "--simulate", "--json"]
    done = subprocess.run([sys.executable, "-m", "kernelforge_tui.cli", *command], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    reply = json.loads(done.stdout)
    assert reply["error"] == "bad-input" and f"being written by pid {process.pid}" in reply["message"]


def test_kill_9_frees_the_run_and_marks_it_interrupted(holder: tuple[subprocess.Popen[str], Path]) -> None:
    process, run_dir = holder
    viewer = RunStore.open(run_dir, readonly=True)
    assert viewer.run_info().state == "running"
    process.kill()
    process.wait()
    assert viewer.run_info().state == "interrupted"  # the OS released the lock, though the holder's child lives
    with RunStore.resume(run_dir) as writer:
        assert viewer.run_info().state == "running"
        assert writer.run_info().state == "running"
    assert viewer.run_info().state == "interrupted"  # closed without finishing
    viewer.close()


def test_a_file_system_without_locks_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    new_run(tmp_path / "run").close()

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(StoreError, match=r"cannot lock .*writer.lock \(No locks available\): keep runs on"):
        RunStore.resume(tmp_path / "run")
    with RunStore.open(tmp_path / "run", readonly=True) as viewer:
        assert viewer.run_info().state == "starting"  # cannot tell whether a writer lives: not called interrupted


def test_interrupted_only_without_a_writer(tmp_path: Path) -> None:
    store = new_run(tmp_path / "run")
    store.set_state("running")
    assert store.run_info().state == "running"
    store.set_state("finished", "done", ended=True)
    store.close()
    with RunStore.open(tmp_path / "run", readonly=True) as viewer:
        assert viewer.run_info().state == "finished"  # a finished run is finished, writer or not


# ---- damaged stores and rows -------------------------------------------------------------------------


RECORDED = ROOT / "examples" / "runs" / "softmax_bf16" / DB_NAME
MEASUREMENTS_PAGE = 700
"""A page of the recorded run's measurements table, which a run's summary (`run_info`) reads."""


def events_page() -> int:
    """A page of the recorded run's events table, which only a view's replay reads."""
    return RECORDED.read_bytes().rindex(b'"kind":"budget"') // 4096


def damaged_copy(run_dir: Path, page: int = MEASUREMENTS_PAGE) -> Path:
    """A copy of a recorded run in `run_dir`, with one page of garbage."""
    run_dir.mkdir(parents=True)
    shutil.copy(RECORDED, run_dir / DB_NAME)
    with open(run_dir / DB_NAME, "r+b") as db:
        db.seek(4096 * page)
        db.write(bytes(range(256)) * 16)
    return run_dir


def test_an_empty_or_damaged_store_is_one_line_everywhere(tmp_path: Path) -> None:
    empty = tmp_path / "runs" / "empty"
    empty.mkdir(parents=True)
    (empty / DB_NAME).write_bytes(b"")
    for readonly, resume in ((True, False), (False, False), (False, True)):
        with pytest.raises(StoreError, match="is not a run database") as info:
            RunStore.resume(empty) if resume else RunStore.open(empty, readonly)
        assert "\n" not in str(info.value)
    assert (empty / DB_NAME).stat().st_size == 0  # nothing was written into it
    damaged = damaged_copy(tmp_path / "runs" / "damaged")
    with RunStore.open(damaged, readonly=True) as store, pytest.raises(StoreError, match="the file is damaged") as info:
        store.verify()
    assert str(damaged / DB_NAME) in str(info.value) and "restore it from a copy" in str(info.value)
    with pytest.raises(StoreError, match="the file is damaged"):
        RunStore.resume(damaged)
    new_run(tmp_path / "runs" / "good").close()
    listing = list_runs(tmp_path / "runs")
    assert [i.run_id for i in listing.runs] == ["good"]
    assert {s.run_dir.name: s.reason for s in listing.skipped}.keys() == {"empty", "damaged"}
    assert all(str(s.run_dir / DB_NAME) in s.reason for s in listing.skipped)


def test_a_damaged_store_opens_in_the_tui_as_one_error(tmp_path: Path) -> None:
    from kernelforge_tui.tui.source import StoreSource

    with pytest.raises(StoreError, match="the file is damaged"):
        StoreSource.open(damaged_copy(tmp_path / "damaged", events_page()))  # at once, not halfway through a replay


def _raw_rows(run_dir: Path, table: str, rows: list[tuple[str, bytes]]) -> None:
    conn = sqlite3.connect(run_dir / DB_NAME)
    extra = ", at" if table == "commands" else ""
    for kind, text in rows:
        conn.execute(f"INSERT INTO {table} (kind, json{extra}) VALUES (?, CAST(? AS TEXT){', 0' if extra else ''})",
                     (kind, text))  # fmt: skip
    conn.commit()
    conn.close()


BAD_ROWS = [("log", b"{not json"), ("teleport", b'{"kind": "teleport"}'), ("log", b'{"kind": "log", "text": "\xff"}')]


def test_bad_event_and_command_rows_are_marked_not_raised(tmp_path: Path) -> None:
    store = new_run(tmp_path / "run")
    store.append_event(LogLine(text="before"))
    _raw_rows(store.run_dir, "events", BAD_ROWS)
    store.append_event(LogLine(text="after"))
    events = [event for _, event in store.events_since(0)]
    assert [type(e).__name__ for e in events] == ["LogLine", "UnreadableRow", "UnreadableRow", "UnreadableRow",
                                                  "LogLine"]  # fmt: skip
    bad = [e for e in events if isinstance(e, UnreadableRow)]
    assert [b.table for b in bad] == ["events"] * 3 and bad[1].kind == "teleport" and "teleport" in bad[1].error
    assert "row 2 (log) skipped" in bad[0].log_line().text and bad[0].log_line().level == "warning"
    store.record_command(Pause())
    _raw_rows(store.run_dir, "commands", BAD_ROWS)
    store.record_command(Stop())
    pending = [cmd for _, cmd in store.pending_commands()]
    assert [type(c).__name__ for c in pending] == ["Pause", "UnreadableRow", "UnreadableRow", "UnreadableRow",
                                                   "Stop"]  # fmt: skip
    store.close()


async def test_a_run_with_bad_event_rows_opens_in_the_tui(tmp_path: Path) -> None:
    from kernelforge_tui.tui.app import KernelForgeApp
    from kernelforge_tui.tui.config import TuiSettings
    from kernelforge_tui.tui.source import StoreSource

    store = new_run(tmp_path / "run")
    store.append_event(LogLine(text="before"))
    _raw_rows(store.run_dir, "events", BAD_ROWS)
    store.set_state("finished", "done", ended=True)
    store.close()
    logs = [line.text for line in StoreSource.open(tmp_path / "run").snapshot().logs]
    assert "before" in logs and sum("skipped" in text for text in logs) == 3
    app = KernelForgeApp(StoreSource.open(tmp_path / "run"), TuiSettings())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("q")
    assert app.return_code in (None, 0)  # `kernelforge open` exits 0


# ---- read-only directories -----------------------------------------------------------------------------


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory an unprivileged user can reach (pytest's own tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="kf-readonly-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for sub in [path, *path.rglob("*")]:
            if sub.is_dir():
                sub.chmod(0o755)
        shutil.rmtree(path)


def read_only(path: Path) -> None:
    """chmod -R a-w."""
    for sub in [*path.rglob("*"), path]:
        sub.chmod(sub.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


PRELUDE = """\
import os, sys
from pathlib import Path
from kernelforge_tui.store import RunStore, StoreError, list_runs
import tests.store.test_run_writer
"""
"""Everything the unprivileged code uses, imported before it drops root (Python's library is under root's home)."""


def unprivileged(code: str, *args: str) -> str:
    """Run `code` as a user that file modes bind (nobody, when this is root); its output, checked."""
    prelude = PRELUDE + (f"os.setgid({NOBODY}); os.setuid({NOBODY})\n" if os.geteuid() == 0 else "")
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


@pytest.mark.skipif(not EXAMPLE_RUNS, reason="example runs missing")
def test_the_shipped_runs_open_from_a_read_only_checkout(shared_dir: Path) -> None:
    for run in EXAMPLE_RUNS:  # what a checkout holds: the database alone
        (shared_dir / run.name).mkdir()
        shutil.copy(run / DB_NAME, shared_dir / run.name / DB_NAME)
    read_only(shared_dir)
    out = unprivileged(
        """
        listing = list_runs(Path(sys.argv[1]))
        assert not listing.skipped, listing.skipped
        for info in listing.runs:
            with RunStore.open(info.run_dir, readonly=True) as store:
                store.verify()
                print(info.run_id, info.state, len(store.nodes()), len(store.events_since(0, 10)))
        """,
        str(shared_dir),
    )
    lines = sorted(out.split("\n")[:-1])
    assert [line.split()[0] for line in lines] == sorted(run.name for run in EXAMPLE_RUNS)
    assert all(int(line.split()[2]) > 100 and line.split()[3] == "10" for line in lines), out
    assert sorted(p.name for p in shared_dir.rglob("*") if p.is_file()) == [DB_NAME] * len(EXAMPLE_RUNS)


def test_a_read_only_run_cannot_be_resumed_or_created(shared_dir: Path) -> None:
    new_run(shared_dir / "run").close()
    read_only(shared_dir)
    out = unprivileged(
        """
        for attempt in (lambda: RunStore.resume(Path(sys.argv[1]) / "run"),
                        lambda: tests.store.test_run_writer.new_run(Path(sys.argv[1]) / "new")):
            try:
                attempt()
            except StoreError as exc:
                print(exc)
        """,
        str(shared_dir),
    )
    resumed, created = out.split("\n")[:2]
    assert f"cannot take the writer lock in {shared_dir / 'run'} (Permission denied)" in resumed
    assert f"cannot create the run directory {shared_dir / 'new'} (Permission denied)" in created


def test_a_live_run_is_never_read_as_immutable(shared_dir: Path) -> None:
    """The fallback to `immutable=1` is for runs no process writes: the writer lock decides."""
    writer = new_run(shared_dir / "run")
    writer.set_state("running")
    (shared_dir / "run" / f"{DB_NAME}-shm").chmod(0o600)  # the WAL index, out of this reader's reach
    read_only(shared_dir)
    code = """
        try:
            with RunStore.open(Path(sys.argv[1]), readonly=True) as store:
                print(store.run_info().state)
        except StoreError as exc:
            print(exc)
        """
    assert "a live process writes this run" in unprivileged(code, str(shared_dir / "run"))
    (shared_dir / "run").chmod(0o755)
    writer.close()
    read_only(shared_dir)
    assert unprivileged(code, str(shared_dir / "run")).strip() == "interrupted"


def test_store_errors_are_bad_input() -> None:
    assert issubclass(StoreError, BadInput) and StoreError("x").exit_code == 2
