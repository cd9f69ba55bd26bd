"""The start shared by the GPU worker and the vendor timing: pinned to its GPU, its own session, stderr's tail kept."""

from __future__ import annotations

import asyncio
import collections
import sys

import pytest

from kernelforge_tui.gpu.subprocess_worker import spawn_worker, tail_text

REPORTS = (
    "import os, sys; print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('KF_PROBE'), os.getsid(0) == "
    "os.getpid(), flush=True); sys.stderr.write('first\\n  \\nlast\\n')"
)


def _spawn(gpu: int | None) -> tuple[str, list[str]]:
    """What the process printed about itself, and the stderr lines kept (two at most)."""

    async def scenario() -> tuple[str, list[str]]:
        tail: collections.deque[str] = collections.deque(maxlen=2)
        process, drain = await spawn_worker([sys.executable, "-c", REPORTS], tail, gpu, env={"KF_PROBE": "on"})
        assert process.stdout is not None
        line = await process.stdout.readline()
        await process.wait()
        await drain
        return line.decode().strip(), list(tail)

    return asyncio.run(scenario())


def test_a_worker_sees_only_its_gpu_runs_in_its_own_session_and_keeps_its_last_stderr_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    printed, tail = _spawn(3)
    assert printed == "3 on True"
    assert tail == ["", "last"] and tail_text(tail, 2) == "last", "the last lines, blank ones left out of the text"
    printed, _ = _spawn(None)
    assert printed == "7 on True", "no GPU given: the environment's own choice stands"
