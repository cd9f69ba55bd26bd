"""Budgets that hold: the clock stops while paused, a time cap stops new work on time (only the evaluations on a GPU
finish after it), a spent cap is refused on resume with the one to raise, and a follower sees the writer finish."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelforge_tui.config import load_settings
from kernelforge_tui.engine import budget as budget_module
from kernelforge_tui.engine.budget import Budget, BudgetUsage, Meter
from kernelforge_tui.engine.setup import RunOptions, continue_note, prepare_run
from kernelforge_tui.engine.view import RunView
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import RunStore
from kernelforge_tui.tui.source import StoreSource
from kernelforge_tui.vocabulary.commands import Pause, Resume, Stop
from kernelforge_tui.vocabulary.events import BudgetUsed, EngineEvent, NodeChanged
from tests.engine.test_search import Harness, make_card, wait_for
from tests.support.fakes.endless import Endless

ROOT = Path(__file__).resolve().parents[2]
TOY = "tests.engine.test_search:ToyProposer"


class Clock:
    """time.monotonic, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def test_the_clock_stops_while_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(budget_module, "time", clock)
    meter = Meter(Budget(max_minutes=1.0), BudgetUsage())
    meter.start_session()
    clock.now += 10
    assert meter.seconds_left() == pytest.approx(50)  # what is not yet accounted counts against the cap
    assert meter.pause() == pytest.approx(10)
    clock.now += 1000  # paused: none of it counts
    assert meter.exhausted() is None and meter.elapse() == 0.0
    meter.resume()
    clock.now += 45
    assert meter.exhausted() is None and meter.seconds_left() == pytest.approx(5)
    clock.now += 5
    assert meter.exhausted() == "time budget reached (1.0 of 1 min)" and meter.clock_reached()
    assert meter.elapse() == pytest.approx(50) and meter.usage.elapsed_s == pytest.approx(60)


async def test_a_time_budget_stops_new_work_on_time(tmp_path: Path) -> None:
    """Four candidates in flight at 0.5 s each: without withdrawing the queued ones the run overran by seconds."""
    eval_s, cap_s = 0.5, 1.5
    h = Harness(tmp_path, eval_seconds=eval_s)
    search = h.search(Budget(max_minutes=cap_s / 60))
    events = search.subscribe()
    info = await search.run()
    assert "time budget" in info.reason and info.state == "finished"
    shown = [e.elapsed_s for e in _drain(events) if isinstance(e, BudgetUsed)]
    assert max(shown) <= cap_s + eval_s + 0.5, shown  # the cap, the evaluation on the GPU, and some latency
    assert info.active_seconds <= cap_s + eval_s + 0.5
    withdrawn = [r for r in h.store.node_records() if r.status == "proposed"]
    assert withdrawn and all(r.attempts == 0 for r in withdrawn)  # handed back as if never taken
    h.store.close()

    resumed = h.search(Budget(max_minutes=(cap_s + 4) / 60))  # a resume evaluates them first, none lost
    await resumed.run()
    after = {n.id: n for n in h.store.nodes()}
    assert all(after[r.id].status == "timed" for r in withdrawn)
    h.store.close()


async def test_paused_time_does_not_count_against_the_time_budget(tmp_path: Path) -> None:
    h = Harness(tmp_path, Endless(), eval_seconds=0.05)  # never out of kernels: only the time budget ends it
    search = h.search(Budget(max_minutes=4.0 / 60))
    events = search.subscribe()
    task = asyncio.create_task(search.run())
    await wait_for(events, lambda e: isinstance(e, NodeChanged) and e.node.status == "timed" and e.node.id > 1)
    await search.send(Pause())
    await asyncio.sleep(4.5)  # longer than the whole budget
    assert search.state == "paused" and search.stop_reason is None
    await search.send(Resume())
    started = time.monotonic()
    info = await asyncio.wait_for(task, 30)
    assert "time budget" in info.reason
    assert time.monotonic() - started > 0.3  # it went on after the pause
    assert 4.0 <= info.active_seconds < 4.0 + 0.5
    h.store.close()


def test_a_resume_with_a_spent_cap_is_refused_naming_the_cap_to_raise(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    run_dir = tmp_path / "run"
    settings = load_settings()
    first = RunOptions(run_dir=run_dir, budget=Budget(max_iterations=2), proposer=TOY, simulate=True)
    search = prepare_run(card.root, settings, first)
    try:
        asyncio.run(search.run())
    finally:
        search.store.close()
    with pytest.raises(BadInput, match=r"run run has spent its budget \(iteration budget reached \(2 of 2\)\): .*"
                                       r"continue it with a larger one, e.g. --budget-iters 4"):  # fmt: skip
        prepare_run(None, settings, RunOptions(resume=str(run_dir), simulate=True))
    more = prepare_run(None, settings, RunOptions(resume=str(run_dir), simulate=True, budget=Budget(max_iterations=4)))
    more.store.close()  # the lock was given back by the refusal: a larger cap continues the run
    with RunStore.open(run_dir, readonly=True) as store:
        note = continue_note(store.run_info())
    assert note is not None and f"`kernelforge open {run_dir} --resume`" in note
    assert f"`kernelforge optimize --resume {run_dir} --simulate`" in note


def test_a_follower_in_another_process_sees_the_writer_finish(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    run_dir = tmp_path / "run"
    writer = subprocess.Popen(
        [sys.executable, "-m", "kernelforge_tui.cli", "optimize", str(card.root), "--simulate", "--simulate-seconds",
         "0.2", "--budget-iters", "40", "--run-dir", str(run_dir), "--proposer", TOY, "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"COLUMNS": "200"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "run.sqlite").exists() or _state(run_dir) != "running":
            assert writer.poll() is None and time.monotonic() < deadline, writer.communicate()
            time.sleep(0.05)
        view, states = asyncio.run(_follow_and_stop(run_dir))
        assert writer.wait(60) == 0, writer.communicate()
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert "stopping" in states and states[-1] == "finished" and view.header.state == "finished"
    assert not view.live
    with RunStore.open(run_dir, readonly=True) as store:
        info = store.run_info()
    assert info.state == "finished" and info.reason == "stopped by request" and info.ended_at is not None


async def _follow_and_stop(run_dir: Path) -> tuple[RunView, list[str]]:
    """Follow the run as `open` does, send Stop through the store, and fold events until the view says finished."""
    source = StoreSource.open(run_dir)
    try:
        assert source.can_steer
        view = RunView.from_snapshot(source.snapshot())
        await source.send(Stop())
        states: list[str] = []
        deadline = time.monotonic() + 60
        while view.live and time.monotonic() < deadline:
            view.apply(events := await source.poll_events())
            states += [e.state for e in events if e.kind == "state"]
            await asyncio.sleep(0.1)
        return view, states
    finally:
        await source.close()


def _state(run_dir: Path) -> str:
    with RunStore.open(run_dir, readonly=True) as store:
        return store.run_info().state


def _drain(queue: asyncio.Queue[EngineEvent]) -> list[EngineEvent]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out
