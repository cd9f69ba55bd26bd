"""The run store on real SQLite: schema and migrations, the public API, readonly readers in other processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import (
    DB_NAME,
    SCHEMA_VERSION,
    RunStore,
    StoreError,
    UnknownNode,
    UnreadableRecord,
    list_runs,
    new_run_dir,
    resolve_run,
)
from kernelforge_tui.vocabulary.commands import AddHint, Pause, Stop
from kernelforge_tui.vocabulary.evaluation import EvalResult, Evaluation, Timing
from kernelforge_tui.vocabulary.events import LogLine, NodeAdded
from kernelforge_tui.vocabulary.nodes import FailureKind, NodeOutcome, NodeStats, NodeStatus
from kernelforge_tui.vocabulary.profiles import HardwareReport, NodeProfile, ProfileReport
from kernelforge_tui.vocabulary.rewards import Reward, RewardTerm
from tests.engine.test_search import make_card, toy_kernel

ROOT = Path(__file__).resolve().parents[2]


def new_store(tmp_path: Path, name: str = "run-a") -> RunStore:
    card = make_card(tmp_path / "card")
    return RunStore.create(tmp_path / "runs" / name, card, "simulated", "simulated (no GPU)", RunSettings())


def timed(speedup: float, latency: float, gpu_s: float = 0.25) -> Evaluation:
    timing = Timing(median_us=latency, p10_us=latency, p90_us=latency, cv=0.0, reps=5)
    result = EvalResult(ok=True, speedup=speedup, gpu_seconds=gpu_s, candidate=timing)
    return Evaluation(ok=True, result=result, ceiling_share=0.4)


def outcome(evaluation: Evaluation, reward: Reward | None = None) -> NodeOutcome:
    """What the search would decide about a node from its evaluation (the store takes it as given)."""
    if not evaluation.ok:
        return NodeOutcome(status=NodeStatus.FAILED, failure=evaluation.failure, reason=evaluation.reason)
    assert evaluation.result is not None and evaluation.result.candidate is not None
    return NodeOutcome(
        status=NodeStatus.TIMED,
        latency_us=evaluation.result.candidate.median_us,
        speedup=evaluation.speedup,
        ceiling_share=evaluation.ceiling_share,
        reward=reward,
    )


def profile_of(kernel: str) -> NodeProfile:
    hardware = HardwareReport(
        kernel=kernel,
        bottleneck="memory_bandwidth",
        sm_pct=10,
        memory_pct=90,
        threshold_pct=30,
        reason="",
        key_metrics=[],
    )
    return NodeProfile(profile=ProfileReport(kernel=kernel, metrics={}), hardware=hardware)


def test_schema_wal_and_busy_timeout(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    conn = sqlite3.connect(store.run_dir / DB_NAME)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"run", "nodes", "measurements", "events", "commands", "profiles", "schema_version"} <= tables
    conn.close()
    assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
    store.close()
    again = RunStore.open(store.run_dir)  # migrating an up-to-date store changes nothing
    assert again.run_info().card_name == "toy_vector_add"
    again.close()


def test_newer_schema_is_refused_with_a_fix(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    store.close()
    conn = sqlite3.connect(store.run_dir / DB_NAME)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="upgrade kernelforge"):
        RunStore.open(store.run_dir)
    with pytest.raises(StoreError, match="schema version 99"):
        RunStore.open(store.run_dir, readonly=True)


def test_create_refuses_an_existing_run_and_open_a_missing_one(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    store.close()
    with pytest.raises(StoreError, match="already holds a run"):
        new_store(tmp_path)
    with pytest.raises(StoreError, match="no run in"):
        RunStore.open(tmp_path / "nowhere")


def test_nodes_measurements_and_run_info(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    k = toy_kernel(128, 2)
    root = store.add_node(None, "// baseline", k.plan, "baseline", "card")
    child = store.add_node(root.id, k.source, k.plan, k.mutation, "toy", k.params)
    failed = store.add_node(root.id, k.source + "\n", k.plan, "broken", "toy")
    assert store.node(child.id).status == "proposed" and store.node(child.id).parent_id == root.id
    reward = Reward(total=0.9, terms=[RewardTerm(name="speedup", value=0.9, explanation="2.5x")], explanation="2.5x")
    store.finish_node(root.id, timed(1.0, 100.0), outcome(timed(1.0, 100.0)), {})
    store.finish_node(
        child.id, timed(2.5, 40.0), outcome(timed(2.5, 40.0), reward), {root.id: NodeStats(visits=2, value=0.45)}
    )
    bad = Evaluation(ok=False, failure=FailureKind.COMPILE, reason="compile error: line 3: expected ';'")
    store.finish_node(failed.id, bad, outcome(bad), {})
    info = store.run_info()
    assert (info.node_count, info.failure_count, info.in_flight_count) == (3, 1, 0)
    assert (info.best_node_id, info.best_speedup, info.best_latency_us) == (child.id, 2.5, 40.0)
    assert info.best_ceiling_share == 0.4 and info.gpu_seconds == pytest.approx(0.5)
    assert info.backend == "simulated" and info.state == "starting"
    assert store.node(root.id).visits == 2 and store.node(root.id).value == pytest.approx(0.45)
    assert store.node(child.id).reward_total == 0.9 and store.node(child.id).reward_note == "2.5x"
    assert store.node_record(child.id).reward == reward and store.node_record(root.id).reward is None
    assert store.node(failed.id).failure == "compile" and store.node(failed.id).reason == bad.reason
    assert store.node_source(child.id) == (k.source, k.plan)
    evaluation = store.evaluation(child.id)
    assert evaluation is not None and evaluation.speedup == 2.5
    assert store.evaluation(failed.id) == bad
    record = store.node_records()[1]
    assert record.params == {"block": 128, "vec": 2} and record.last_measurement == 2
    assert [n.id for n in store.nodes()] == [root.id, child.id, failed.id]
    for read in (store.node, store.node_source, store.node_record):
        with pytest.raises(UnknownNode, match="no node 99"):
            read(99)
    assert store.set_banned(child.id, True).banned and store.set_export(child.id, True).export
    assert store.set_pinned(child.id, True).pinned and not store.set_pinned(child.id, False).pinned
    store.set_hints(child.id, ["go wider"])
    assert store.node_records()[1].hints == ["go wider"]
    assert store.set_status(child.id, NodeStatus.PROFILED).status == "profiled"
    store.queue_node(failed.id, attempts=2)
    assert store.node(failed.id).status == "proposed" and store.node_record(failed.id).attempts == 2
    store.close()


def test_settings_and_card_dir_come_back_as_recorded(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    assert store.settings(RunSettings) == RunSettings() and store.card_dir() == (tmp_path / "card").resolve()
    later = RunSettings(budget=Budget(max_iterations=7))
    store.set_settings(later)
    assert store.settings(RunSettings).budget.max_iterations == 7
    store.close()


def test_store_errors_are_bad_input() -> None:
    assert issubclass(StoreError, BadInput) and issubclass(UnknownNode, LookupError)


def test_events_commands_and_profiles(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    k = toy_kernel(64, 1)
    view = store.add_node(None, k.source, k.plan)
    first = store.append_event(NodeAdded(node=view))
    store.append_event(LogLine(text="hello", node_id=view.id))
    events = store.events_since(0)
    assert [type(e).__name__ for _, e in events] == ["NodeAdded", "LogLine"]
    assert store.events_since(first) == events[1:]
    assert store.events_since(0, limit=1) == events[:1]
    a = store.record_command(Pause())
    b = store.record_command(AddHint(node_id=view.id, text="unroll"))
    assert [c for _, c in store.pending_commands()][1] == AddHint(node_id=view.id, text="unroll", at=_at(store, b))
    store.mark_applied(a)
    assert [i for i, _ in store.pending_commands()] == [b]
    assert store.profile(view.id) is None
    store.save_profile(view.id, profile_of("first"))
    store.save_profile(view.id, profile_of("second"))
    assert store.profile(view.id) == profile_of("second") and store.profiled_ids() == {view.id}
    store._conn.execute("UPDATE profiles SET json = ? WHERE node = ?", ('{"profile": {"kernel": "k"}}', view.id))
    with pytest.raises(UnreadableRecord, match=f"node {view.id}'s profile .* first profile.metrics"):
        store.profile(view.id)
    store.close()


def _at(store: RunStore, command_id: int) -> float:
    return dict(store.pending_commands())[command_id].at


def test_readonly_store_reads_but_never_writes(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    reader = RunStore.open(store.run_dir, readonly=True)
    assert reader.run_info().node_count == 0
    with pytest.raises(StoreError, match="readonly"):
        reader.record_command(Stop())
    k = toy_kernel(64, 1)
    store.add_node(None, k.source, k.plan)
    assert reader.run_info().node_count == 1  # sees the writer's commits
    reader.close()
    store.close()


def test_list_runs_and_resolve(tmp_path: Path) -> None:
    a = new_store(tmp_path, "run-a")
    time.sleep(0.01)
    b = RunStore.create(tmp_path / "runs" / "run-b", make_card(tmp_path / "card"), "gpu", "NVIDIA H200", RunSettings())
    (tmp_path / "runs" / "junk").mkdir()
    (tmp_path / "runs" / "junk" / DB_NAME).write_text("not a database")
    listing = list_runs(tmp_path / "runs")
    assert [i.run_id for i in listing.runs] == ["run-b", "run-a"]  # newest first, the broken one skipped
    assert [s.run_dir.name for s in listing.skipped] == ["junk"] and "not a database" in listing.skipped[0].reason
    assert list_runs(tmp_path / "none").runs == []
    assert resolve_run("run-a", tmp_path / "runs") == tmp_path / "runs" / "run-a"
    assert resolve_run(str(tmp_path / "runs" / "run-b")) == tmp_path / "runs" / "run-b"
    with pytest.raises(StoreError):
        resolve_run("run-z", tmp_path / "runs")
    fresh = new_run_dir("softmax", tmp_path / "runs")
    assert fresh.parent == tmp_path / "runs" and fresh.name.endswith("-softmax")
    a.close()
    b.close()


READER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kernelforge_tui.store import RunStore
    store = RunStore.open(Path(sys.argv[1]), readonly=True)
    print("ready", flush=True)
    last, last_event, reads, seen = 0, 0, 0, set()
    deadline = time.time() + 20
    while time.time() < deadline:
        nodes = store.nodes()
        info = store.run_info()
        events = store.events_since(last_event)
        assert len(nodes) >= last, (len(nodes), last)
        assert info.node_count >= len(nodes)
        last = len(nodes)
        seen.add(last)
        if events:
            last_event = events[-1][0]
        reads += 1
        if info.state == "finished":  # everything is committed now: one last full read
            last = len(store.nodes())
            while events := store.events_since(last_event):
                last_event = events[-1][0]
            break
    print(last, last_event, len(seen), flush=True)
    """
)


def test_a_reader_process_follows_a_live_writer(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store.run_dir)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
    k = toy_kernel(64, 1)
    root = store.add_node(None, k.source, k.plan)
    for i in range(300):
        if i % 20 == 0:
            time.sleep(0.02)  # let the reader in between batches
        view = store.add_node(root.id, f"{k.source}// {i}\n", k.plan, f"variant {i}", "toy")
        store.append_event(NodeAdded(node=view))
        measured = timed(1.0 + i / 100, 50.0, 0.001)
        store.finish_node(view.id, measured, outcome(measured), {})
    store.set_state("finished", "done", ended=True)
    out, err = reader.communicate(timeout=30)
    assert reader.returncode == 0, err
    nodes, last_event, distinct_counts = (int(x) for x in out.split())
    assert nodes == 301 and last_event == 300
    assert distinct_counts > 3  # it saw the run grow, not only its end
    store.close()
