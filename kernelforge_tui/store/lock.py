"""The run's writer lock: a run has one writer, its search; viewers probe whether it is alive."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from pydantic import BaseModel, ValidationError

from kernelforge_tui.store.errors import StoreError

LOCK_NAME = "writer.lock"
"""The run's writer lock: `flock`ed by the one process that writes the run (the search), for that process's whole
life; the OS releases it when the process dies, `kill -9` included. It also holds who took it (WriterInfo)."""
LOCK_WAIT_S = 0.5
"""How long a new writer retries: a viewer's liveness probe holds a shared lock on the file for an instant."""


class WriterInfo(BaseModel):
    """Who holds a run's writer lock, as written into the lock file: for the message that refuses a second writer."""

    pid: int
    host: str
    since: float

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} since {since}"


def take_writer_lock(run_dir: Path) -> int:
    """Become the run's one writer: the locked file descriptor, to keep open for the process's life (it is not
    inherited by subprocesses: Python opens it close-on-exec). A run already written by a live process is refused."""
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(
            f"cannot take the writer lock in {run_dir} ({exc.strerror}): a run is written only where this user can "
            f"write (copy it with `kernelforge runs copy {run_dir} DEST` to resume it; `kernelforge open {run_dir}` "
            "views it as it is)"
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
