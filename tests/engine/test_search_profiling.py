"""Profiling inside the search and the reward on every node: scheduling, on demand, errors, storage, migration.

No GPU: a test backend (the simulated one with its profiling hook replaced) returns NodeProfiles built from
the real ncu CSVs captured on the H200 (tests/support/fixtures/ncu/*.csv) through `parse_csv` and `analyse`; the
plain simulated backend makes up no ncu numbers and says profiling is unavailable.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import pytest

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.config import ProfileSettings, RewardWeights, Settings, load_settings
from kernelforge_tui.engine.backend import Lanes, ProfilingBackend, SimulatedBackend, make_builder
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.profile_schedule import ProfileReason
from kernelforge_tui.engine.search import Search
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.gpu.ncu.csv_report import parse_csv
from kernelforge_tui.gpu.ncu.hardware import analyse
from kernelforge_tui.gpu.ncu.run import NcuNotPermitted, ProfileError
from kernelforge_tui.proposers.base import Proposal
from kernelforge_tui.store import DB_NAME, SCHEMA_VERSION, RunStore
from kernelforge_tui.vocabulary.commands import ProfileNode
from kernelforge_tui.vocabulary.events import EngineEvent, LogLine, NodeChanged
from kernelforge_tui.vocabulary.profiles import NodeProfile, ProfileReport
from tests.engine.test_search import ToyProposer, make_card, run_settings, toy_kernel, wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "support" / "fixtures" / "ncu"
OLD_RUN = ROOT / "examples" / "runs" / "rms_norm_bf16"


def fixture_profile(name: str) -> NodeProfile:
    """A NodeProfile from a real ncu CSV captured on the H200."""
    kernel = parse_csv((FIXTURES / f"{name}.csv").read_text())[0]
    report = ProfileReport(kernel=kernel.kernel, metrics=kernel.metrics, seconds=0.01)
    return NodeProfile(profile=report, hardware=analyse(report))


PROFILES = {name: fixture_profile(name) for name in ("stream_copy", "uncoalesced", "fma_chain")}


class ProfilingTestBackend(SimulatedBackend):
    """The simulated backend with a fake profiler behind the real hook: fixture profiles, or an error."""

    def __init__(self, *args: object, error: ProfileError | None = None, delay: float = 0.0, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.error = error
        self.delay = delay
        self.calls: list[str] = []
        self.evaluations_during: list[int] = []

    async def profile(self, source: str, plan: LaunchPlan, measured_us: float | None = None) -> NodeProfile:
        self.calls.append(source)
        before = self.evaluations
        await asyncio.sleep(self.delay)
        self.evaluations_during.append(self.evaluations - before)
        if self.error is not None:
            raise self.error
        # faster kernels stream; slower ones wait on latency: the reward then has hardware terms to show
        speedup = self.true_speedup(source, plan)
        return PROFILES["stream_copy" if speedup >= 1.5 else "uncoalesced"]


class SlowSeedProposer(ToyProposer):
    """The toy proposer with one more seed, slower than the baseline: neither a new best nor better than its
    parent, so it is not profiled (and its children beat it without being new bests)."""

    def seeds(self, card: object) -> list[Proposal]:
        slow = toy_kernel(64, 1)
        source = slow.source.replace("speedup=1.0", "speedup=0.7")
        return [*super().seeds(card), slow.model_copy(update={"source": source})]  # type: ignore[arg-type]


def make_search(
    tmp: Path,
    budget: Budget,
    *,
    backend: SimulatedBackend | None = None,
    profile: ProfileSettings | None = None,
    eval_seconds: float = 0.005,
) -> tuple[Search, SimulatedBackend, RunStore]:
    card = make_card(tmp / "card")
    settings = load_settings()
    backend = backend or ProfilingTestBackend(card, make_builder(settings), eval_seconds=eval_seconds)
    run_dir = tmp / "run"
    if (run_dir / DB_NAME).exists():
        store = RunStore.resume(run_dir)
    else:
        store = RunStore.create(run_dir, card, backend.name, backend.gpu_name, RunSettings())
    profile = profile or ProfileSettings(max_pending=100, max_share=1.0)
    settings = run_settings(budget)
    search = Search(card, SlowSeedProposer(), backend, store, settings, profile=profile, reward=RewardWeights())
    return search, backend, store


def expected_profiled(store: RunStore) -> tuple[set[int], set[int]]:
    """(new bests, nodes faster than their parent but no new best), replaying outcomes in measured order."""
    records = sorted(store.node_records(), key=lambda r: r.last_measurement or 0)
    speedups = {r.id: r.speedup for r in records}
    best: float | None = None
    bests: set[int] = set()
    better: set[int] = set()
    for r in records:
        if r.speedup is None:
            continue
        if best is None or r.speedup > best:
            best = r.speedup
            bests.add(r.id)
            continue
        parent = speedups.get(r.parent_id) if r.parent_id is not None else None
        if parent is not None and r.speedup > parent:
            better.add(r.id)
    return bests, better


def test_the_backends_expose_the_profiling_hook(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    backend = SimulatedBackend(card, make_builder(load_settings()))
    assert isinstance(backend, ProfilingBackend)


async def test_profiles_new_bests_and_nodes_that_beat_their_parent_only(tmp_path: Path) -> None:
    search, backend, store = make_search(tmp_path, Budget(max_iterations=14))
    info = await search.run()
    assert info.state == "finished"
    bests, better = expected_profiled(store)
    nodes = {n.id: n for n in store.nodes()}
    profiled = {i for i, n in nodes.items() if n.profiled}
    assert profiled == bests | better
    assert better, "the toy search has a node faster than its parent that is no new best"
    assert set(nodes) - profiled, "and nodes that are neither, which are not profiled"
    assert isinstance(backend, ProfilingTestBackend) and len(backend.calls) == len(profiled)  # each once
    for node_id in profiled:
        assert nodes[node_id].status == "profiled"
        saved = store.profile(node_id)
        assert saved is not None and saved.hardware.bottleneck in ("memory_bandwidth", "memory_latency")
    # a node profiled with its parent: the reward now carries hardware evidence, in its terms and its words
    pairs = [n for n in nodes.values() if n.profiled and n.parent_id is not None and nodes[n.parent_id].profiled]
    assert pairs
    reward = store.node_record(pairs[0].id).reward
    assert reward is not None and reward.term("throughput") is not None and reward.term("dram_bytes") is not None
    assert "of peak" in reward.explanation
    assert pairs[0].reward_total == pytest.approx(reward.total)
    assert pairs[0].reward_note == reward.explanation
    store.close()


async def test_profiling_runs_beside_the_pipeline(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    backend = ProfilingTestBackend(card, make_builder(load_settings()), eval_seconds=0.02, delay=0.3)
    search, _, store = make_search(tmp_path, Budget(max_iterations=12), backend=backend)
    await search.run()
    assert backend.calls
    assert max(backend.evaluations_during) > 0  # candidates were evaluated while a profile ran
    store.close()


async def test_profile_node_command_profiles_on_demand(tmp_path: Path) -> None:
    off = ProfileSettings(new_best=False, beats_parent=False)
    search, backend, store = make_search(tmp_path, Budget(max_iterations=8), profile=off, eval_seconds=0.05)
    events = search.subscribe()
    task = asyncio.create_task(search.run())
    timed = await wait_for(events, lambda e: isinstance(e, NodeChanged) and e.node.status == "timed"
                           and e.node.parent_id is not None)  # fmt: skip
    assert isinstance(timed, NodeChanged)
    target = timed.node.id
    await search.send(ProfileNode(node_id=target))
    changed = await wait_for(events, lambda e: isinstance(e, NodeChanged) and e.node.id == target and e.node.profiled)
    assert isinstance(changed, NodeChanged) and changed.node.status == "profiled"
    await search.send(ProfileNode(node_id=999))  # unknown: a warning, no crash
    await task
    assert isinstance(backend, ProfilingTestBackend) and len(backend.calls) == 1
    assert {n.id for n in store.nodes() if n.profiled} == {target}
    kinds = [cmd.kind for _, cmd in store.pending_commands()]
    assert kinds == []  # applied
    rows = sqlite3.connect(store.run_dir / DB_NAME).execute("SELECT kind, applied FROM commands").fetchall()
    assert ("profile", 1) in rows
    store.close()


async def test_a_profiler_error_warns_once_and_ends_auto_profiling(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    error = NcuNotPermitted("ncu is not permitted to read the GPU's performance counters", "run as root")
    backend = ProfilingTestBackend(card, make_builder(load_settings()), error=error)
    search, _, store = make_search(tmp_path, Budget(max_iterations=12), backend=backend)
    events = search.subscribe()
    info = await search.run()
    assert info.state == "finished" and info.node_count == 13
    assert len(backend.calls) == 1 and not search.profiles.auto
    logs = [e for e in drain(events) if isinstance(e, LogLine) and "not profiled" in e.text]
    assert len(logs) == 1 and logs[0].level == "warning" and "not permitted" in logs[0].text
    assert not any(n.profiled for n in store.nodes())
    assert all(n.status == "timed" for n in store.nodes())
    store.close()


async def test_the_simulated_backend_invents_no_profiles(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    backend = SimulatedBackend(card, make_builder(load_settings()), eval_seconds=0.005)
    search, _, store = make_search(tmp_path, Budget(max_iterations=6), backend=backend)
    events = search.subscribe()
    await search.run()
    logs = [e for e in drain(events) if isinstance(e, LogLine) and "not profiled" in e.text]
    assert len(logs) == 1 and "simulated backend runs no GPU" in logs[0].text
    assert all(n.status == "timed" and not n.profiled for n in store.nodes())
    assert all(store.profile(n.id) is None for n in store.nodes())
    store.close()


def drain(queue: asyncio.Queue[EngineEvent]) -> list[EngineEvent]:
    out: list[EngineEvent] = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


async def test_rewards_are_stored_steer_the_tree_and_survive_reopening(tmp_path: Path) -> None:
    search, _, store = make_search(tmp_path, Budget(max_iterations=10))
    await search.run()
    totals = {n.id: search.tree.reward(search.tree[n.id]) for n in store.nodes()}
    store.close()
    with RunStore.open(tmp_path / "run", readonly=True) as again:
        for node in again.nodes():
            reward = again.node_record(node.id).reward
            assert reward is not None and reward.term("speedup") is not None
            assert node.reward_total == pytest.approx(reward.total) == pytest.approx(totals[node.id])
            assert node.reward_note == reward.explanation != ""
            assert sum(t.value for t in reward.terms) == pytest.approx(reward.total)
    resumed, _, store2 = make_search(tmp_path, Budget(max_iterations=10))  # restores the tree from the store
    for node_id, total in totals.items():
        assert resumed.tree.reward(resumed.tree[node_id]) == pytest.approx(total)
    assert resumed.tree.root.value == pytest.approx(sum(totals.values()))
    store2.close()


def test_an_old_schema_run_migrates_and_keeps_its_nodes(tmp_path: Path) -> None:
    assert (OLD_RUN / DB_NAME).is_file()
    with RunStore.open(OLD_RUN, readonly=True) as old:  # readonly reads the old schema as it is
        assert old.schema_version == 1
        before = old.nodes()
        old_info = old.run_info()
        assert all(n.reward_total is None and n.reward_note == "" for n in before)
        assert old.node_record(before[0].id).reward is None
        assert old.node_records()[0].reward is None
        assert old.llm_calls() == [] and old.llm_totals().calls == 0 and old.model_records() == []
    conn = sqlite3.connect(OLD_RUN / DB_NAME)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 1  # untouched
    conn.close()
    copy = tmp_path / "old-run"
    copy.mkdir()
    shutil.copy(OLD_RUN / DB_NAME, copy / DB_NAME)
    with RunStore.open(copy) as migrated:
        assert migrated.schema_version == SCHEMA_VERSION == 6
        after = migrated.nodes()
        assert [n.model_dump(exclude={"reward_total", "reward_note"}) for n in after] == [
            n.model_dump(exclude={"reward_total", "reward_note"}) for n in before
        ]
        assert migrated.run_info().node_count == old_info.node_count
        assert migrated.node_record(after[0].id).reward is None
    conn = sqlite3.connect(copy / DB_NAME)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    assert {"reward_json", "speedup_low", "speedup_high"} <= {r[1] for r in conn.execute("PRAGMA table_info(nodes)")}
    assert "best_node" in {r[1] for r in conn.execute("PRAGMA table_info(run)")}
    assert {"repair_of", "judge_score"} <= {r[1] for r in conn.execute("PRAGMA table_info(nodes)")}
    assert conn.execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0] == 0
    conn.close()
    with RunStore.open(copy, readonly=True) as reread:  # no node was promoted in it: the fastest is its best
        assert reread.run_info().best_node_id == old_info.best_node_id


def test_profile_and_reward_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELFORGE_PROFILE__TIMEOUT_S", "45")
    monkeypatch.setenv("KERNELFORGE_PROFILE__MAX_PENDING", "2")
    monkeypatch.setenv("KERNELFORGE_PROFILE__CLASSIFIER__THRESHOLD_PCT", "25")
    monkeypatch.setenv("KERNELFORGE_REWARD__EVIDENCE_CAP", "0.05")
    settings = Settings()
    assert settings.profile.timeout_s == 45 and settings.profile.max_pending == 2
    assert settings.profile.classifier.threshold_pct == 25
    assert settings.reward.evidence_cap == 0.05


def test_a_new_best_takes_the_place_of_a_waiting_profile(tmp_path: Path) -> None:
    """With room for one waiting profile: a new best evicts a node that only beat its parent, then an older
    best; a node that only beat its parent never evicts anything."""
    search, _, _ = make_search(tmp_path, Budget(max_iterations=1), profile=ProfileSettings(max_pending=1))
    profiles = search.profiles
    assert profiles.request(5, ProfileReason.BEATS_PARENT)
    assert not profiles.request(6, ProfileReason.BEATS_PARENT)
    assert profiles.request(7, ProfileReason.NEW_BEST)
    assert profiles.request(8, ProfileReason.NEW_BEST)
    assert not profiles.request(9, ProfileReason.BEATS_PARENT)
    assert profiles.waiting() == [8]


async def test_gpu_lanes_are_first_come_first_served() -> None:
    """The evaluation loop asking for the lane again right after releasing it does not jump ahead of the
    profiler already waiting (an asyncio.Queue would hand it straight back: the profiler starved)."""
    lanes: Lanes[str] = Lanes()
    lanes.release("gpu0")
    held = await lanes.acquire()
    order: list[str] = []

    async def profiler() -> None:
        lane = await lanes.acquire()
        order.append("profiler")
        lanes.release(lane)

    waiting = asyncio.create_task(profiler())
    await asyncio.sleep(0)
    lanes.release(held)
    lane = await lanes.acquire()
    order.append("evaluation")
    await waiting
    assert order == ["profiler", "evaluation"] and lane == "gpu0"


async def test_a_cancelled_waiter_does_not_lose_the_gpu_lane() -> None:
    lanes: Lanes[str] = Lanes()
    lanes.release("gpu0")
    held = await lanes.acquire()
    cancelled = asyncio.create_task(lanes.acquire())
    behind = asyncio.create_task(lanes.acquire())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    lanes.release(held)
    assert await behind == "gpu0"
    with pytest.raises(asyncio.CancelledError):
        await cancelled
