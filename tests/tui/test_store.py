"""The TUI over real runs written by the engine: a recorded run opened from its store, a run followed
live while another process writes it (and steered through the store, until it ends or dies), and an
in-process search; and an agent team's calls on a real store, in each of the three."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.cards import load_card
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.events import EventBus
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.store import RunStore
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.screens import ConversationScreen, ModelsScreen
from kernelforge_tui.tui.source import LiveSearchSource, StoreSource
from kernelforge_tui.tui.widgets import DiffPane, MetricsPane, SearchTree, StreamPane
from kernelforge_tui.vocabulary.commands import Stop
from kernelforge_tui.vocabulary.evaluation import EvalResult, Evaluation, Timing
from kernelforge_tui.vocabulary.events import LlmCallEnded, LlmCallStarted, LlmText, NodeAdded, StateChanged
from kernelforge_tui.vocabulary.llm import LlmCall
from kernelforge_tui.vocabulary.nodes import NodeOutcome, NodeStatus
from tests.conftest import EXAMPLES, ROOT
from tests.support.fakes.synthetic import PLAN
from tests.support.fakes.tui import metrics_text, screen_text, settle

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


async def test_a_recorded_run_explains_its_rewards_and_exports_a_kernel_beside_it(tmp_path: Path) -> None:
    """The reward with its terms comes from the store's node record; `m` writes the node's kernel with the engine's
    `write_kernel` into kernels/ beside the run, from a finished run opened read-only."""
    run_dir = tmp_path / "runs" / "run"
    process = optimize(run_dir, "--budget-iters", "6")
    _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err.decode()[-2000:]
    with RunStore.open(run_dir, readonly=True) as store:
        info = store.run_info()
        assert info.best_node_id is not None
        record = store.node_record(info.best_node_id)
        source_text, _ = store.node_source(info.best_node_id)
    assert record.reward is not None
    source = StoreSource.open(run_dir)
    app = KernelForgeApp(source, TuiSettings())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        assert app.selected == info.best_node_id
        detail = app.query_one(MetricsPane)._current
        assert detail is not None and detail[0].reward == record.reward
        assert f"{record.reward.total:+.3f} the search's score of it" in metrics_text(app)
        await pilot.press("m")
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        out = tmp_path / "runs" / "kernels" / f"run-node-{info.best_node_id}"
        assert (out / "kernel.cu").read_text() == source_text
        summary = (out / "summary.md").read_text()
        assert f"node {info.best_node_id}" in summary and record.reward.explanation in summary
        assert "plan.toml" in {p.name for p in out.iterdir()}
        assert f"#{info.best_node_id} exported to {out}" in screen_text(app).replace("\n", "")
        await pilot.press("q")


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
            while str(app.state.header.state) != "finished":
                assert time.monotonic() < deadline, "the other process did not stop"
                await pilot.pause(0.2)
            await pilot.press("q")
        assert process.wait(timeout=60) == 0
        with RunStore.open(run_dir, readonly=True) as store:
            kinds = [e.state for _, e in store.events_since(0, 100000) if isinstance(e, StateChanged)]
            assert "paused" in kinds and kinds[-1] == "finished"
            assert store.pending_commands() == []  # both commands were applied by the other process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_in_process_search_under_the_tui() -> None:
    from kernelforge_tui.tui.launch import new_search

    search = new_search(CARD, Budget(max_iterations=5, max_tokens=10**6), simulate=True)
    assert search.settings.budget.max_tokens == 10**6  # the TUI's search takes every budget optimize takes
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

    search = new_search(CARD, Budget(max_iterations=500), simulate=True)
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


# -- LLM agents over a real store ------------------------------------------------------------------------------

PROMPT = json.dumps(
    [
        {"role": "system", "content": "You write fast CUDA kernels. Reply with one ```cuda block."},
        {"role": "user", "content": "Kernel #1 is memory-bandwidth-bound: use float4 loads."},
    ]
)


def agent_call(node_id: int, role: str = "coder", **fields: Any) -> LlmCall:
    values: dict[str, Any] = {
        "node_id": node_id,
        "role": role,
        "provider": "openai",
        "model": "gpt-4.1",
        "prompt": PROMPT,
        "prompt_sha256": "a" * 64,
        "reply": "```cuda\n__global__ void softmax_rows_v4() {}\n```",
        "reply_sha256": "b" * 64,
        "input_tokens": 1500,
        "output_tokens": 500,
        "cost_nanousd": 4_200_000,
        "latency_s": 2.5,
        "first_token_s": 0.4,
    }
    return LlmCall.model_validate(values | fields)


class AgentWriter:
    """What the engine does with an agent team, on a real store: calls recorded and their events emitted through
    the run's event bus (the text streamed to in-process subscribers only), the kernels they wrote added as nodes
    linked to their calls."""

    def __init__(self, run_dir: Path) -> None:
        self.store = RunStore.create(run_dir, load_card(CARD), "simulated", "simulated (no GPU)", RunSettings())
        self.bus = EventBus(self.store)
        self.store.set_state("running")
        self.root = self.store.add_node(None, "// baseline\n", PLAN, "baseline", "templates")
        self.measure(self.root.id, 1.0)

    def measure(self, node_id: int, speedup: float) -> None:
        timing = Timing(median_us=100 / speedup, p10_us=99 / speedup, p90_us=101 / speedup, cv=0.01, reps=5)
        evaluation = Evaluation(ok=True, result=EvalResult(ok=True, speedup=speedup, candidate=timing))
        outcome = NodeOutcome(status=NodeStatus.TIMED, latency_us=100 / speedup, speedup=speedup, best=speedup > 1)
        self.store.finish_node(node_id, evaluation, outcome, {})
        self.bus.changed(node_id)

    def start(self, key: str, node_id: int, role: str = "coder") -> None:
        self.bus.emit(LlmCallStarted(call_key=key, role=role, provider="openai", model="gpt-4.1", node_id=node_id))

    def end(self, key: str, call: LlmCall) -> LlmCall:
        recorded = self.store.record_llm_call(call)
        self.bus.emit(LlmCallEnded(call_key=key, call=recorded, totals=self.store.llm_totals()))
        return recorded

    def child(self, parent: int, calls: list[LlmCall], **fields: Any) -> int:
        ids = [c.id for c in calls if c.id is not None]
        node = self.store.add_node(parent, "// float4\n", PLAN, "float4 loads", "agents", llm_calls=ids, **fields)
        self.bus.emit(NodeAdded(node=node))
        return node.id


async def wait_for(pilot: Any, done: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, what
        await pilot.pause(0.1)


async def reads_done(app: KernelForgeApp, pilot: Any) -> None:
    """The app's reads from its source landed (`settle` waits for every worker when there is none but the
    engine's, which an in-process search keeps running)."""
    await pilot.pause()
    reads = [w for w in app.workers if w.group != "engine"]
    if reads:
        await app.workers.wait_for_complete(reads)
    await pilot.pause()


async def conversation_text(app: KernelForgeApp, pilot: Any) -> str:
    await pilot.press("c")
    await reads_done(app, pilot)
    assert isinstance(app.screen, ConversationScreen)
    await reads_done(app, pilot)  # the screen's read, then the draw it starts
    await reads_done(app, pilot)
    text = screen_text(app)
    await pilot.press("escape")
    await pilot.pause()
    return text


async def test_a_finished_agent_run_shows_its_calls_models_and_meters(tmp_path: Path) -> None:
    writer = AgentWriter(tmp_path / "agents")
    root = writer.root.id
    planned = writer.end("p", agent_call(root, "planner", reply="Use float4 loads.", prompt=None))
    wrote = writer.end("c", agent_call(root))
    child = writer.child(root, [wrote], judge_score=0.75)
    writer.measure(child, 1.4)
    writer.end("j", agent_call(root, "judge", outcome="malformed", error="no score in the reply", child_id=None))
    writer.store.set_state("finished", "iteration budget", ended=True)
    writer.store.close()

    source = StoreSource.open(tmp_path / "agents")
    app = KernelForgeApp(source, TuiSettings())
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(app, pilot)
        assert app.selected == child  # the best node
        text = screen_text(app)
        assert "$0.0126  6k tok" in text  # three calls, from the store
        assert "judge" in text and " 0.75" in text
        assert "coder openai/gpt-4.1: 1,500 in + 500 out tokens, $0.0042, 2.5 s, ok" in text  # replayed from the log
        assert "judge openai/gpt-4.1: 1,500 in + 500 out tokens, $0.0042, 2.5 s, malformed: no score" in text
        text = await conversation_text(app, pilot)
        assert f"Conversation · #{child}" in text and f"worked on #{root} · wrote #{child}" in text
        assert "Kernel #1 is memory-bandwidth-bound: use float4 loads." in text and "softmax_rows_v4" in text
        assert "planner" not in text  # it worked on the root and wrote nothing
        app.query_one(SearchTree).select_id(root)
        await settle(app, pilot)
        text = await conversation_text(app, pilot)
        assert "3 calls" in text and f"not kept · sha256 {'a' * 64}" in text and "Use float4 loads." in text
        assert planned.id is not None
        await pilot.press("M")
        await settle(app, pilot)
        assert isinstance(app.screen, ModelsScreen)
        await app.screen.workers.wait_for_complete()
        await pilot.pause()
        assert app.screen.records is not None
        (record,) = app.screen.records
        assert (record.calls, record.kernels, record.correct, record.best_speedup) == (3, 1, 1, 1.4)
        shown = screen_text(app)  # a simulated run proves no kernel correct: no success rate
        assert "openai/gpt-4.1" in shown and "no kernel is proven correct" in shown and "100%" not in shown


async def test_a_followed_agent_run_shows_a_call_in_flight_and_its_end(tmp_path: Path) -> None:
    """From another process no text streams (it is not stored): the call shows as being written, and its reply
    in the conversation once it ends."""
    writer = AgentWriter(tmp_path / "followed")
    root = writer.root.id
    writer.start("c1", root)  # in flight before the view opens: the replay finds it
    try:
        source = StoreSource.open(tmp_path / "followed")
        assert source.can_steer
        app = KernelForgeApp(source, TuiSettings(refresh_hz=20))
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(app, pilot)
            assert app.selected == root
            stream = app.query_one(StreamPane)
            assert stream.display and stream.key == "c1"
            assert "coder openai/gpt-4.1 writing for #1" in screen_text(app)
            assert "from another process: the text comes at its end" in screen_text(app)
            wrote = writer.end("c1", agent_call(root))
            writer.child(root, [wrote])
            await wait_for(pilot, lambda: stream.key is None, "the call's end did not arrive")
            await settle(app, pilot)
            assert app.query_one(DiffPane).display
            text = screen_text(app)
            assert "#1 coder openai/gpt-4.1: 1,500 in + 500 out tokens" in text and "$0.0042  2k tok" in text
            text = await conversation_text(app, pilot)
            assert "worked on #1 · wrote #2" in text and "softmax_rows_v4" in text
            await pilot.press("q")
    finally:
        writer.store.close()


class AgentSearch:
    """A search in this process that the test drives: its events go through the run's bus (stored, then queued),
    and it runs until it is told to stop."""

    def __init__(self, writer: AgentWriter) -> None:
        self.writer = writer
        self.stopped = asyncio.Event()
        self.backend: object = None
        """Not on a cluster: the TUI's cluster screen shows the store's counts."""

    def subscribe(self) -> asyncio.Queue[Any]:
        return self.writer.bus.subscribe()

    async def send(self, cmd: Any) -> None:
        if isinstance(cmd, Stop):
            self.stopped.set()

    async def run(self) -> None:
        await self.stopped.wait()


async def test_an_in_process_agent_run_streams_the_coder_into_the_diff(tmp_path: Path) -> None:
    writer = AgentWriter(tmp_path / "live")
    root = writer.root.id
    search = AgentSearch(writer)
    app = KernelForgeApp(LiveSearchSource(search, writer.store), TuiSettings(refresh_hz=20))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await reads_done(app, pilot)
            stream = app.query_one(StreamPane)
            writer.start("c1", root)
            for piece in ("```cuda\n", "__global__ void ", "softmax_rows_v4() {}"):
                writer.bus.emit(LlmText(call_key="c1", text=piece))
            await wait_for(pilot, lambda: stream.display and len(stream.lines) == 2, "the text did not stream")
            assert list(stream.lines) == ["```cuda", "__global__ void softmax_rows_v4() {}"]
            assert writer.store.events_since(0, 1000)[-1][1].kind == "llm_started"  # the text is not stored
            wrote = writer.end("c1", agent_call(root))
            writer.child(root, [wrote])
            await wait_for(pilot, lambda: not stream.display, "the diff did not come back")
            text = await conversation_text(app, pilot)
            assert "worked on #1 · wrote #2" in text and "Kernel #1 is memory-bandwidth-bound" in text
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running, "the app did not stop the search and quit")
    finally:
        writer.store.close()
