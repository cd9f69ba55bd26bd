"""The worker client's watchdog, death handling and restarts, against real stand-in subprocesses."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kernelforge_tui.cards import load_card, plan_for_kernel
from kernelforge_tui.cards.plan import ResolvedLaunch
from kernelforge_tui.config import Settings
from kernelforge_tui.engine.backend import make_builder
from kernelforge_tui.gpu.detect import GpuInfo
from kernelforge_tui.gpu.evaluate import Evaluator, GpuWorker, WorkerDied, WorkerTimeout
from kernelforge_tui.gpu.protocol import Evaluate, KernelRef, RequestEnvelope
from kernelforge_tui.vocabulary.evaluation import EvalResult
from tests.conftest import EXAMPLES

FAKE = [sys.executable, "-m", "tests.support.fakes.worker"]
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
    pidfile, mode = tmp_path / "pids", tmp_path / "mode"
    monkeypatch.setenv("FAKE_WORKER_MODE_FILE", str(mode))
    monkeypatch.setenv("FAKE_WORKER_PIDFILE", str(pidfile))
    worker = GpuWorker(argv=FAKE)
    # Up and answering first, so the timeout below runs out on the hang, not on a slow start (a loaded CI machine
    # once took more than 1.5 s to start the stand-in, which then never wrote its pids).
    mode.write_text("ok")
    assert isinstance(await worker.request(REQUEST, timeout_s=60), EvalResult)
    mode.write_text("hang")
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


async def test_evaluator_turns_every_worker_failure_into_a_typed_result(tmp_path: Path) -> None:
    """Start, a fault mid-evaluation, then a restarted worker that cannot load the card: typed results, no raise."""
    card = load_card(EXAMPLES / "cards" / "vector_add_f32")
    kernel = sorted((card.root / "candidates").glob("*.cu"))[0]
    mode = tmp_path / "mode"
    mode.write_text("ok")
    worker = GpuWorker(argv=FAKE)
    gpu = GpuInfo(index=0, name="Fake GPU", uuid="GPU-fake", capability="9.0", driver="0", memory_mib=1)
    settings = Settings()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAKE_WORKER_MODE_FILE", str(mode))
        evaluator = Evaluator(card, make_builder(settings, "sm_90"), settings, gpu, worker=worker)
        await evaluator.start()
        assert evaluator.ceilings is not None and evaluator.ceilings.copy_gbps == 4000.0
        good = await evaluator.evaluate(kernel.read_text(), plan_for_kernel(kernel))
        assert good.ok and good.build is not None and good.build.ok
        mode.write_text("die")
        faulted = await evaluator.evaluate(kernel.read_text(), plan_for_kernel(kernel))
        assert not faulted.ok and faulted.failure == "launch" and "illegal memory access" in faulted.reason
        mode.write_text("refuse_card")
        refused = await evaluator.evaluate(kernel.read_text(), plan_for_kernel(kernel))
        assert not refused.ok and refused.failure == "worker" and "needs 9 GB" in refused.reason
        mode.write_text("ok")
        recovered = await evaluator.evaluate(kernel.read_text(), plan_for_kernel(kernel))
        assert recovered.ok and worker.restarts == 2
        await evaluator.close()
