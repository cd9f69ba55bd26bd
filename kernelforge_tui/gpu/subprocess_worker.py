"""The long-lived Python subprocesses that answer JSON lines on stdin/stdout: the GPU worker (`evaluate.GpuWorker`)
and the vendor timing (`engine.vendor_timer.VendorTimer`) start and kill theirs here, so both are pinned, isolated
and drained the same way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
from collections.abc import Iterable, Mapping, Sequence

PIPE_LIMIT = 16 * 1024 * 1024
"""The longest line read from the process (a reply carries every timed sample, a build or check log)."""


async def spawn_worker(
    argv: Sequence[str],
    stderr_tail: collections.deque[str],
    gpu: int | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[asyncio.subprocess.Process, asyncio.Task[None]]:
    """Start `argv` with its three streams piped, in a session of its own (`kill_group` then ends whatever it
    started too), seeing only `gpu` when one is given (CUDA_VISIBLE_DEVICES) and `env` added to this process's
    environment. The task returned reads its stderr as it comes into `stderr_tail` (a full pipe would stall the
    process) and ends with it."""
    pinned = {} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)}
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **pinned, **(env or {})},
        start_new_session=True,
        limit=PIPE_LIMIT,
    )
    return process, asyncio.create_task(_keep_tail(process, stderr_tail))


async def _keep_tail(process: asyncio.subprocess.Process, stderr_tail: collections.deque[str]) -> None:
    assert process.stderr is not None
    async for line in process.stderr:
        stderr_tail.append(line.decode(errors="replace").rstrip())


def tail_text(stderr_tail: Iterable[str], lines: int) -> str:
    """The last `lines` lines kept that are not blank, on one line for an error message."""
    return " | ".join(line for line in list(stderr_tail)[-lines:] if line.strip())


def kill_group(process: asyncio.subprocess.Process) -> None:
    """Kill the process's whole group (the worker and anything it started) unless it has already exited."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
