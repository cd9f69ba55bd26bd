"""The vendor library's timing process (`python -m kernelforge_tui.suite.vendor_timing`), kept per GPU.

The bench times each card's vendor library (cuBLAS, cuSPARSE, cuDNN through torch) beside its search: on this
machine one process per GPU lane, on a cluster one per GPU worker (engine.cluster.remote).
"""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import Sequence
from typing import TypeVar

from pydantic import ValidationError

from kernelforge_tui.gpu.subprocess_worker import kill_group, spawn_worker, tail_text
from kernelforge_tui.suite.vendor_timing import VendorReply, VendorRequest

Reply = TypeVar("Reply", bound=VendorReply)

VENDOR_TIMEOUT_S = 600.0
"""A vendor subprocess that has not answered in this long is killed (torch's start-up and cuFFT/cuDNN plans
included, ten minutes is far beyond any honest call)."""
VENDOR_STDERR_LINES = 4
"""The last lines of a vendor process's stderr that its error quotes (a traceback's last lines say what failed)."""


class VendorTimer:
    """The vendor timing process of one GPU lane (`python -m kernelforge_tui.suite.vendor_timing`), kept for the
    lane's cards so torch's import and CUDA start-up are paid once. It is pinned to the lane's GPU as the evaluation
    worker is (CUDA_VISIBLE_DEVICES). A process that answers with an error (a faulting vendor call may leave its CUDA
    context unusable), hangs past the timeout or dies is ended; the next card starts a fresh one."""

    def __init__(
        self, gpu: int | None = None, timeout_s: float = VENDOR_TIMEOUT_S, argv: Sequence[str] | None = None
    ) -> None:
        """`argv` replaces the process's command (tests run stand-ins that die)."""
        self.gpu = gpu
        self.timeout_s = timeout_s
        self.argv = list(argv or [sys.executable, "-m", "kernelforge_tui.suite.vendor_timing"])
        self.process: asyncio.subprocess.Process | None = None
        self.started = 0
        """Processes started so far (one per lane while nothing goes wrong)."""
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=VENDOR_STDERR_LINES)
        self._drain: asyncio.Task[None] | None = None

    async def _start(self) -> asyncio.subprocess.Process:
        self.started += 1
        self.stderr_tail.clear()
        process, self._drain = await spawn_worker(self.argv, self.stderr_tail, self.gpu)
        return process

    async def time(self, request: VendorRequest) -> VendorReply:
        """The request's reply; a crash or a hang is the reply's error."""
        return await self.time_as(request, VendorReply)

    async def time_as(self, request: VendorRequest, reply_type: type[Reply]) -> Reply:
        """The request's reply read as `reply_type`, the process's own (`cast.beside`'s for its command)."""
        if self.process is None or self.process.returncode is not None:
            self.process = await self._start()
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(request.model_dump_json().encode() + b"\n")
            await process.stdin.drain()
            async with asyncio.timeout(self.timeout_s):
                line = await process.stdout.readline()
        except TimeoutError:
            await self.close()
            return reply_type(error=f"no answer within {self.timeout_s:g} s: the vendor timing was killed")
        except (BrokenPipeError, ConnectionResetError):
            line = b""
        except asyncio.CancelledError:
            await self.close()
            raise
        try:
            reply = reply_type.model_validate_json(line)
        except ValidationError:
            await self.close()
            tail = tail_text(self.stderr_tail, VENDOR_STDERR_LINES)
            return reply_type(error=f"the vendor timing exited {process.returncode} without a reply: {tail}")
        if reply.error:
            await self.close()
        return reply

    async def close(self) -> None:
        """End the process (its process group: whatever it started goes with it)."""
        process, self.process = self.process, None
        if process is None:
            return
        kill_group(process)
        await process.wait()
        if self._drain is not None:
            await self._drain  # stderr ends with the process: its last lines are all kept
