"""The worker client's watchdog, death handling and restarts, against real stand-in subprocesses."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kernelforge_tui.cards.plan import ResolvedLaunch
from kernelforge_tui.gpu.evaluate import GpuWorker, WorkerDied, WorkerTimeout
from kernelforge_tui.gpu.protocol import EvalResult, Evaluate, KernelRef, RequestEnvelope

FAKE = [sys.executable, "-m", "tests.fakes.worker"]
REQUEST = RequestEnvelope(
    request=Evaluate(
        candidate=KernelRef(
            cubin=Path("k.cubin"),
            launch=ResolvedLaunch(entry="k", grid=(1, 1, 1), block=(32, 1, 1), shared_bytes=0, args=[]),
        ),
        baseline=None,
    )
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is as good as dead
        return f.read().split()[2] != "Z"


async def test_answers_are_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_WORKER_MODE", "ok")
    worker = GpuWorker(argv=FAKE)
    reply = await worker.request(REQUEST, timeout_s=30)
    assert isinstance(reply, EvalResult) and reply.ok and reply.gpu_seconds == 0.01
    await worker.close()
    assert not worker.alive


async def test_hung_worker_is_killed_with_its_whole_process_group(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("FAKE_WORKER_MODE", "hang")
    monkeypatch.setenv("FAKE_WORKER_PIDFILE", str(pidfile))
    worker = GpuWorker(argv=FAKE)
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match=r"no answer within 1\.5 s"):
        await worker.request(REQUEST, timeout_s=1.5)
    assert time.monotonic() - started < 10
    parent, child = (int(p) for p in pidfile.read_text().split())
    deadline = time.monotonic() + 5
    while (_alive(parent) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(parent) and not _alive(child)


async def test_dead_worker_reports_its_last_words_and_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_WORKER_MODE", "die")
    worker = GpuWorker(argv=FAKE)
    with pytest.raises(WorkerDied, match="illegal memory access"):
        await worker.request(REQUEST, timeout_s=30)
    monkeypatch.setenv("FAKE_WORKER_MODE", "ok")
    reply = await worker.request(REQUEST, timeout_s=30)
    assert isinstance(reply, EvalResult) and reply.ok
    assert worker.restarts == 1
    await worker.close()


async def test_garbage_from_the_worker_is_a_failure_not_a_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_WORKER_MODE", "garbage")
    worker = GpuWorker(argv=FAKE)
    with pytest.raises(WorkerDied, match="garbage"):
        await worker.request(REQUEST, timeout_s=30)
    assert not worker.alive
