"""The TUI over real runs written by the engine: a recorded run opened from its store, a run followed
live while another process writes it (and steered through the store, until it ends or dies), and an
in-process search."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.store import RunStore
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.source import LiveSearchSource, StoreSource
from kernelforge_tui.tui.widgets import DiffPane, SearchTree

from .conftest import EXAMPLES, ROOT
from .fakes.tui import screen_text, settle

CARD = EXAMPLES / "cards" / "softmax_f32_small"
pytestmark = pytest.mark.skipif(not CARD.is_dir(), reason="example card missing")


def optimize(run_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`kernelforge optimize --simulate` in another process, with this test's isolated dirs."""
    command = [sys.executable, "-m", "kernelforge_tui.cli", "optimize", str(CARD), "--simulate", "--json",
               "--run-dir", str(run_dir), *extra]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def follow(process: subprocess.Popen[bytes], run_dir: Path) -> StoreSource:
    """The run another process is writing, once its store exists and its search has begun."""
    deadline = time.monotonic() + 60
    while not (run_dir / "run.sqlite").exists():
        assert time.monotonic() < deadline and process.poll() is None, "the run did not start"
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    return StoreSource.open(run_dir)


async def test_open_a_recorded_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = optimize(run_dir, "--budget-iters", "8")
    _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err.decode()[-2000:]
    with RunStore.open(run_dir, readonly=True) as store:
        info = store.run_info()
    source = StoreSource.open(run_dir)
    assert not source.can_steer
    app = KernelForgeApp(source, TuiSettings())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        assert len(app.state.nodes) == info.node_count
        assert app.state.header.state == "finished"
        assert app.selected == info.best_node_id
        tree = app.query_one(SearchTree)
        assert tree.cursor_node is not None and tree.cursor_node.data == info.best_node_id
        assert app.query_one(DiffPane)._current is not None  # the best node's source against its parent
        assert app.check_action("pause_resume", ()) is None  # a finished run cannot be steered
        await pilot.press("p")
        await pilot.pause()
        await pilot.press("q")
    with RunStore.open(run_dir, readonly=True) as store:
        assert store.pending_commands() == []


async def test_follow_and_steer_a_run_written_by_another_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "live"
    process = optimize(run_dir, "--budget-iters", "400", "--simulate-seconds", "0.05")
    try:
        source = await follow(process, run_dir)
        assert source.can_steer
        app = KernelForgeApp(source, TuiSettings(refresh_hz=10))
        async with app.run_test(size=(120, 40)) as pilot:
            first = len(app.state.nodes)
            deadline = time.monotonic() + 60
            while len(app.state.nodes) <= first + 2:
                assert time.monotonic() < deadline, "no new nodes arrived from the other process"
                await pilot.pause(0.2)
            assert app.query_one(SearchTree).root.children  # drawn as they came
            await pilot.press("p")
            deadline = time.monotonic() + 30
            while app.state.header.state != "paused":
                assert time.monotonic() < deadline, "the other process did not pause"
                await pilot.pause(0.2)
            await pilot.press("S")
            deadline = time.monotonic() + 60
            while app.state.header.state != "finished":
                assert time.monotonic() < deadline, "the other process did not stop"
                await pilot.pause(0.2)
            await pilot.press("q")
        assert process.wait(timeout=60) == 0
        with RunStore.open(run_dir, readonly=True) as store:
            kinds = [e.state for _, e in store.events_since(0, 100000) if getattr(e, "kind", "") == "state"]
            assert "paused" in kinds and kinds[-1] == "finished"
            assert store.pending_commands() == []  # both commands were applied by the other process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_in_process_search_under_the_tui() -> None:
    from kernelforge_tui.tui.launch import new_search

    search = new_search(CARD, budget_iters=5, budget_minutes=None, simulate=True)
    source = LiveSearchSource(search, search.store)
    app = KernelForgeApp(source, TuiSettings(refresh_hz=10))
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 120
        while app.state.header.state != "finished":
            assert time.monotonic() < deadline, "the in-process search did not finish"
            await pilot.pause(0.2)
        assert len(app.state.nodes) >= 5
        assert app.state.best_id is not None
        assert not source.can_steer and app.check_action("stop", ()) is None
        await pilot.press("q")
    store = search.store
    assert store.run_info().state == "finished"
    store.close()


async def test_quit_mid_search_stops_it_resumably() -> None:
    from kernelforge_tui.tui.launch import new_search

    search = new_search(CARD, budget_iters=500, budget_minutes=None, simulate=True)
    source = LiveSearchSource(search, search.store)
    app = KernelForgeApp(source, TuiSettings(refresh_hz=10))
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 60
        while len(app.state.nodes) < 3:
            assert time.monotonic() < deadline
            await pilot.pause(0.2)
        await pilot.press("q")
        deadline = time.monotonic() + 60
        while app.is_running and time.monotonic() < deadline:
            await pilot.pause(0.2)
    store = search.store
    info = store.run_info()
    assert info.state == "finished" and "stop" in info.reason
    recorded = [c for _, c in store.events_since(0, 10)]
    assert recorded  # the run is in the store, resumable with `optimize --resume`
    store.close()


RMS_NORM_RUN = EXAMPLES / "runs" / "rms_norm_bf16"


@pytest.mark.skipif(not RMS_NORM_RUN.is_dir(), reason="example run missing")
async def test_a_recorded_profile_shows_its_class_and_key_metrics() -> None:
    """Node 52 of the recorded H200 rms_norm run has a saved `NodeProfile`: the pane shows its class,
    the class's key metrics and the one-line summary."""
    source = StoreSource.open(RMS_NORM_RUN)
    app = KernelForgeApp(source, TuiSettings())
    async with app.run_test(size=(160, 60)) as pilot:
        await pilot.pause()
        assert app.query_one(SearchTree).select_id(52)
        await settle(app, pilot)
        assert app.selected == 52
        text = screen_text(app)
        assert "memory-bandwidth-bound" in text
        assert "DRAM throughput 77.1%" in text
        assert "profile unreadable" not in text
        await pilot.press("q")


SOFTMAX_RUN = EXAMPLES / "runs" / "softmax_bf16"


@pytest.mark.skipif(not SOFTMAX_RUN.is_dir(), reason="example run missing")
async def test_a_recorded_run_is_read_off_the_ui_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the recorded softmax run and moving through it reads SQLite only from worker threads."""
    threads: list[threading.Thread] = []
    for name in ("nodes", "events_since", "node_source", "evaluation", "profile"):
        read = getattr(RunStore, name)

        def recording(store: RunStore, *args: object, _read: Any = read) -> Any:
            threads.append(threading.current_thread())
            return _read(store, *args)

        monkeypatch.setattr(RunStore, name, recording)
    source = StoreSource.open(SOFTMAX_RUN)
    app = KernelForgeApp(source, TuiSettings())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("down", "down", "d")
        await settle(app, pilot)
        assert app.selected is not None and app.query_one(DiffPane)._current is not None
        await pilot.press("q")
    assert len(threads) > 6 and all(thread is not threading.main_thread() for thread in threads)


async def test_a_followed_run_whose_process_dies_turns_finished(tmp_path: Path) -> None:
    """kill -9 leaves no last event: the follower notices the writer is gone and disables steering."""
    run_dir = tmp_path / "killed"
    process = optimize(run_dir, "--budget-iters", "400", "--simulate-seconds", "0.05")
    try:
        source = await follow(process, run_dir)
        app = KernelForgeApp(source, TuiSettings(refresh_hz=10))
        async with app.run_test(size=(120, 40)) as pilot:
            assert app.check_action("pause_resume", ()) is True
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            deadline = time.monotonic() + 30
            while app.state.header.state != "finished":
                assert time.monotonic() < deadline, "the follower did not notice the dead writer"
                await pilot.pause(0.2)
            assert app.check_action("pause_resume", ()) is None
            assert "interrupted" in app.state.logs[-1].text  # the log says why
            await pilot.press("q")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
