"""A time limit on the user's model (`kernelforge capture --timeout`), which runs in this process.

Why an interval timer (SIGALRM) on the main thread, not a child process: the recorder hooks torch's dispatcher in this
process and copies live tensors out of the model's calls; a child would have to re-import the model and send every
sampled tensor back over a pipe, and a child's failure would lose the user's own traceback. The timer's handler runs
between bytecodes, so it stops Python loops, `time.sleep`, lock waits and anything that returns to Python; a single
native call that never returns (a hung CUDA kernel) is stopped only when it does, and Ctrl-C is then the way out.
POSIX, main thread only: where the timer cannot run, a limit is refused with the reason, never silently not kept.
The handler raises a BaseException, so neither the model's own `except Exception` nor the loader's catches it.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from kernelforge_tui.errors import BadInput


class Stage:
    """What the capture is doing now, for the timeout's and Ctrl-C's messages."""

    def __init__(self, now: str) -> None:
        self.now = now


class CaptureTimeout(BadInput):
    """The model did not finish within the time limit (exit 2: the model, or the limit, needs a change)."""


class _Expired(BaseException):
    pass


def _expire(signum: int, frame: FrameType | None) -> None:
    raise _Expired


@contextlib.contextmanager
def deadline(seconds: float | None, stage: Stage) -> Iterator[None]:
    """Run the body with at most `seconds` of wall time (None: no limit); CaptureTimeout naming `--timeout` and the
    stage it stopped in when it runs over."""
    if seconds is None:
        yield
        return
    if not (math.isfinite(seconds) and seconds > 0):
        raise BadInput(f"--timeout {seconds:g}: give a number of seconds above 0")
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        raise BadInput(
            "--timeout needs a POSIX system and the main thread (it stops the model with SIGALRM): "
            "run the capture from the command line"
        )
    previous = signal.signal(signal.SIGALRM, _expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Expired:
        raise CaptureTimeout(
            f"the model did not finish within --timeout {seconds:g} s (stopped while {stage.now}); nothing was "
            "written: fix the model, or raise --timeout (or timeout_s in the config file's [capture] table)"
        ) from None
    finally:
        signal.signal(signal.SIGALRM, previous)
