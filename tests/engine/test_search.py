"""The search pipeline for real (nvcc builds, SQLite store) on the simulated backend: budgets, commands, resume.

`ToyProposer` and `make_card` are also used by the CLI tests (the subprocess imports this module).
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
from pathlib import Path

import pytest

from kernelforge_tui.build.source_policy import MAX_SOURCE_BYTES
from kernelforge_tui.cards import Card, load_card
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.backend import SimulatedBackend, make_builder
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.search import Search
from kernelforge_tui.engine.settings import PipelineSettings, RunSettings
from kernelforge_tui.engine.strategies import STRATEGIES
from kernelforge_tui.engine.tree import TreeSettings
from kernelforge_tui.errors import BaselineFailed
from kernelforge_tui.proposers.base import Proposal, ProposalContext, Proposer
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.commands import (
    AddHint,
    BanSubtree,
    ExpandNode,
    InjectKernel,
    MarkExport,
    Pause,
    PinSubtree,
    Resume,
    Stop,
)
from kernelforge_tui.vocabulary.events import EngineEvent, LogLine, NodeAdded, NodeChanged

BASELINE = """\
extern "C" __global__ void vadd_naive(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

BLOCKS = (64, 128, 256, 512)
VECS = (1, 2, 4)


def make_card(root: Path) -> Card:
    """A small vector-add card with a naive baseline; fresh sets drawn from seeds (no .npz)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "baseline.cu").write_text(BASELINE)
    spec = OperatorCard.model_validate(
        {
            "name": "toy_vector_add",
            "family": "elementwise",
            "sizes": {"n": 4096},
            "inputs": [{"name": "a", "dtype": "float32", "shape": ["n"]},
                       {"name": "b", "dtype": "float32", "shape": ["n"]}],
            "outputs": [{"name": "c", "dtype": "float32", "shape": ["n"]}],
            "cost": {"bytes": "12 * n"},
            "input_sets": [{"name": "seed_1", "seed": 1}],
            "reference": {"function": "vector_add"},
            "baseline": {"source": "baseline.cu",
                         "plan": {"entry": "vadd_naive", "grid": ["cdiv(n, 256)"], "block": [256],
                                  "args": ["a", "b", "c", "n"]}},
        }
    )  # fmt: skip
    (root / "card.toml").write_text(_toml(spec))
    return load_card(root)


def _toml(spec: OperatorCard) -> str:
    from kernelforge_tui.cards.directory import to_toml

    return to_toml(spec.model_dump(mode="json", exclude_defaults=True))


def toy_speedup(block: int, vec: int) -> float:
    """The simulated speedup the toy kernels declare: better with wider vectors and bigger blocks."""
    return round(1.0 + 0.25 * math.log2(block / 64) + 0.5 * math.log2(vec), 3)


def toy_kernel(block: int, vec: int, fail: str | None = None) -> Proposal:
    directive = f"// kf-simulate: fail={fail}" if fail else f"// kf-simulate: speedup={toy_speedup(block, vec)}"
    source = f"""{directive}
#define BLOCK {block}
#define VEC {vec}
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {{
    int base = (blockIdx.x * BLOCK + threadIdx.x) * VEC;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {{
        int i = base + k;
        if (i < n) c[i] = a[i] + b[i];
    }}
}}
"""
    plan = LaunchPlan(entry="vadd", grid=[f"cdiv(n, {block * vec})"], block=[block], args=["a", "b", "c", "n"])
    return Proposal(source=source, plan=plan, mutation=f"block {block}, vec {vec}", proposer="toy",
                    params={"block": block, "vec": vec})  # fmt: skip


class ToyProposer:
    """Neighbours on a 4 x 3 grid of (block, vec); records every context it is given."""

    name = "toy"

    def __init__(self, fail_vec: int | None = None) -> None:
        self.fail_vec = fail_vec
        self.contexts: list[ProposalContext] = []

    def _make(self, block: int, vec: int) -> Proposal:
        return toy_kernel(block, vec, "mismatch" if vec == self.fail_vec else None)

    def seeds(self, card: Card) -> list[Proposal]:
        return [self._make(128, 1), self._make(64, 2)]

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        self.contexts.append(ctx)
        params = ctx.parent.params or {"block": 64, "vec": 1}
        b, v = BLOCKS.index(int(params["block"])), VECS.index(int(params["vec"]))
        tried = [dict(p) for p in ctx.tried_children_params]
        out: list[Proposal] = []
        for db, dv in ((0, 1), (1, 0), (-1, 0), (0, -1), (1, 1), (2, 0), (0, 2)):
            nb, nv = b + db, v + dv
            inside = 0 <= nb < len(BLOCKS) and 0 <= nv < len(VECS)
            if inside and {"block": BLOCKS[nb], "vec": VECS[nv]} not in tried:
                out.append(self._make(BLOCKS[nb], VECS[nv]))
        return out[:n]


class Harness:
    """A card, a store, a simulated backend and a search, made fresh or on an existing run."""

    def __init__(self, tmp: Path, proposer: ToyProposer | None = None, eval_seconds: float = 0.005) -> None:
        self.tmp = tmp
        self.card = make_card(tmp / "card")
        self.run_dir = tmp / "run"
        self.proposer = proposer or ToyProposer()
        self.eval_seconds = eval_seconds
        self.backend: SimulatedBackend | None = None

    def search(self, budget: Budget, strategy: str = "mcts", **tree: float) -> Search:
        settings = load_settings()
        self.backend = SimulatedBackend(self.card, make_builder(settings), eval_seconds=self.eval_seconds)
        if (self.run_dir / "run.sqlite").exists():
            store = RunStore.resume(self.run_dir)
        else:
            store = RunStore.create(self.run_dir, self.card, self.backend.name, self.backend.gpu_name, RunSettings())
        self.store = store
        return Search(self.card, self.proposer, self.backend, store, run_settings(budget, strategy, **tree))


def run_settings(budget: Budget, strategy: str = "mcts", **tree: float) -> RunSettings:
    """Quick polling and two builds at a time, so a test search reacts within a tenth of a second."""
    return RunSettings(
        strategy=strategy,
        budget=budget,
        tree=TreeSettings.model_validate({"widening_k": 2.0} | tree),
        pipeline=PipelineSettings(build_parallel=2, poll_s=0.05, stats_every_s=0.1),
    )


async def wait_for(queue: asyncio.Queue[EngineEvent], predicate: object, timeout: float = 20.0) -> EngineEvent:
    async def loop() -> EngineEvent:
        while True:
            event = await queue.get()
            if predicate(event):  # type: ignore[operator]
                return event

    return await asyncio.wait_for(loop(), timeout)


def test_toy_proposer_follows_the_protocol() -> None:
    assert isinstance(ToyProposer(), Proposer)


async def test_iteration_budget_stops_after_exactly_n_candidates(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    search = h.search(Budget(max_iterations=6))
    info = await search.run()
    assert info.state == "finished" and "iteration budget" in info.reason
    assert info.node_count == 7  # the root (baseline) and six candidates
    assert info.in_flight_count == 0
    nodes = h.store.nodes()
    assert nodes[0].parent_id is None and nodes[0].proposer == "card" and nodes[0].speedup is not None
    assert all(n.status == "timed" for n in nodes)
    assert info.best_speedup is not None and info.best_speedup > 1.2
    assert info.backend == "simulated" and "simulated" in info.gpu_name
    evaluation = h.store.evaluation(nodes[1].id)
    assert evaluation is not None and evaluation.build is not None and evaluation.build.ok  # really built
    assert "simulated" in evaluation.reason
    h.store.close()


async def test_wall_time_budget_stops_the_search(tmp_path: Path) -> None:
    h = Harness(tmp_path, eval_seconds=0.15)
    search = h.search(Budget(max_minutes=0.8 / 60))
    info = await search.run()
    assert "time budget" in info.reason and info.state == "finished"
    assert 0.8 <= info.active_seconds < 8
    waiting = [r for r in h.store.node_records() if r.status in ("proposed", "built")]
    assert info.in_flight_count == len(waiting)  # withdrawn when the cap was reached: a resume evaluates them
    assert all(r.status == "proposed" and r.attempts == 0 for r in waiting)
    h.store.close()


async def test_gpu_seconds_budget_stops_the_search(tmp_path: Path) -> None:
    h = Harness(tmp_path, eval_seconds=0.1)
    info = await h.search(Budget(max_gpu_seconds=0.35)).run()
    assert "GPU budget" in info.reason
    assert info.gpu_seconds >= 0.35
    assert info.node_count <= 4 + 8  # stops proposing at the cap; only those in flight finish after it
    h.store.close()


async def test_failed_siblings_reach_the_proposer(tmp_path: Path) -> None:
    proposer = ToyProposer(fail_vec=2)
    h = Harness(tmp_path, proposer)
    info = await h.search(Budget(max_iterations=8)).run()
    assert info.failure_count >= 1
    failed = [n for n in h.store.nodes() if n.status == "failed"]
    assert all(n.failure == "mismatch" for n in failed)
    seen = {s.node_id for ctx in proposer.contexts for s in ctx.failed_siblings}
    assert seen & {n.id for n in failed if n.parent_id == 1}
    h.store.close()


async def test_pause_holds_evaluations_until_resume(tmp_path: Path) -> None:
    h = Harness(tmp_path, eval_seconds=0.05)
    search = h.search(Budget(max_iterations=10))
    events = search.subscribe()
    task = asyncio.create_task(search.run())
    await wait_for(events, lambda e: isinstance(e, NodeChanged) and e.node.status == "timed" and e.node.id > 1)
    await search.send(Pause())
    assert search.state == "paused"
    await asyncio.sleep(0.3)  # the evaluation already on the GPU may finish
    assert h.backend is not None
    held = h.backend.evaluations
    await asyncio.sleep(0.6)
    assert h.backend.evaluations == held
    assert not task.done()
    await search.send(Resume())
    info = await asyncio.wait_for(task, 30)
    assert h.backend.evaluations > held and info.node_count == 11
    h.store.close()


async def _seeded_run(tmp_path: Path, proposer: ToyProposer | None = None) -> Harness:
    """A finished run of root + 2 seeds, to steer on resume: seed 2 is (128, 1) at 1.25x, seed 3 (64, 2) at 1.5x."""
    h = Harness(tmp_path, proposer)
    info = await h.search(Budget(max_iterations=2)).run()
    assert info.node_count == 3
    h.store.close()
    return h


async def test_expand_makes_that_nodes_children_next(tmp_path: Path) -> None:
    h = await _seeded_run(tmp_path)
    search = h.search(Budget(max_iterations=6), exploration=0.0, widening_k=1.0)
    assert search.strategy.select() == 3  # UCT would pick the better seed...
    await search.send(ExpandNode(node_id=2))  # ...but the person asked for node 2
    events = search.subscribe()
    await search.run()
    added = [e.node for e in _drain(events) if isinstance(e, NodeAdded)]
    assert added[0].parent_id == 2
    h.store.close()


async def test_hint_reaches_the_proposers_context(tmp_path: Path) -> None:
    h = await _seeded_run(tmp_path)
    search = h.search(Budget(max_iterations=4))
    await search.send(AddHint(node_id=1, text="try wider vectors"))
    await search.send(AddHint(node_id=3, text="block 256"))
    await search.send(ExpandNode(node_id=3))
    await search.run()
    contexts = [c for c in h.proposer.contexts if c.parent.id == 3]
    assert contexts and contexts[0].hints == ["block 256", "try wider vectors"]
    h.store.close()
    assert h.search(Budget(max_iterations=4)).tree.hints_for(3) == ["block 256", "try wider vectors"]  # stored
    h.store.close()


async def test_inject_adds_a_child_and_evaluates_it(tmp_path: Path) -> None:
    h = await _seeded_run(tmp_path)
    search = h.search(Budget(max_iterations=3))
    hand = toy_kernel(512, 4)
    await search.send(InjectKernel(parent_id=2, source=hand.source.replace("speedup=", "speedup=9"),
                                   plan=hand.plan, note="my kernel"))  # fmt: skip
    await search.run()
    injected = [n for n in h.store.nodes() if n.proposer == "hand"]
    assert len(injected) == 1
    node = injected[0]
    assert node.parent_id == 2 and node.mutation == "my kernel" and node.status == "timed"
    assert node.speedup is not None and node.speedup > 9
    assert h.store.run_info().best_node_id == node.id
    h.store.close()


async def test_ban_excludes_a_subtree(tmp_path: Path) -> None:
    h = await _seeded_run(tmp_path)
    search = h.search(Budget(max_iterations=8), exploration=0.0, widening_k=1.0)
    await search.send(BanSubtree(node_id=3))
    await search.run()
    new = [n for n in h.store.nodes() if n.id > 3]
    assert new and all(n.parent_id != 3 for n in new)
    assert h.store.node(3).banned
    h.store.close()


async def test_pin_restricts_the_search_to_a_subtree(tmp_path: Path) -> None:
    h = await _seeded_run(tmp_path)
    search = h.search(Budget(max_iterations=8))
    await search.send(PinSubtree(node_id=2))
    await search.run()
    new = [n for n in h.store.nodes() if n.id > 3]
    assert new
    inside = {2}
    for n in new:  # ids grow from parent to child
        assert n.parent_id in inside
        inside.add(n.id)
    h.store.close()


async def test_commands_from_another_process_connection_steer_the_run(tmp_path: Path) -> None:
    h = Harness(tmp_path, eval_seconds=0.05)
    search = h.search(Budget(max_iterations=12))
    events = search.subscribe()
    task = asyncio.create_task(search.run())
    await wait_for(events, lambda e: isinstance(e, NodeChanged) and e.node.status == "timed" and e.node.id > 1)
    other = RunStore.open(h.run_dir)  # a second connection, as a TUI in another process has
    other.record_command(MarkExport(node_id=1))
    other.record_command(Stop())
    info = await asyncio.wait_for(task, 30)
    assert "stopped by request" in info.reason
    assert other.pending_commands() == []
    assert other.node(1).export
    assert info.node_count < 13 and info.in_flight_count == 0
    other.close()
    h.store.close()


async def test_resume_requeues_candidates_in_flight(tmp_path: Path) -> None:
    h = Harness(tmp_path, eval_seconds=0.2)
    search = h.search(Budget(max_iterations=6))
    events = search.subscribe()
    task = asyncio.create_task(search.run())
    await wait_for(events, lambda e: isinstance(e, NodeChanged) and e.node.status == "timed" and e.node.id > 1)
    task.cancel()  # as a crash would: no clean stop, candidates left in flight
    with pytest.raises(asyncio.CancelledError):
        await task
    before = {n.id: n for n in h.store.nodes()}
    in_flight = [n.id for n in before.values() if n.status in ("proposed", "built")]
    assert in_flight
    h.store.close()

    resumed = h.search(Budget(max_iterations=6))
    info = await resumed.run()
    after = {n.id: n for n in h.store.nodes()}
    assert info.state == "finished" and info.in_flight_count == 0
    assert set(before) <= set(after)
    for node_id, node in before.items():
        if node.status == "timed":
            assert after[node_id].speedup == node.speedup  # nothing committed is lost or redone
        else:
            assert after[node_id].status == "timed"  # in flight: re-queued and evaluated
    assert len(after) == 7
    h.store.close()


async def test_node_lost_in_flight_twice_is_failed(tmp_path: Path) -> None:
    h = await _seeded_run(tmp_path)
    store = RunStore.open(h.run_dir)
    source, plan = toy_kernel(256, 4).source, toy_kernel(256, 4).plan
    node = store.add_node(3, source, plan, "block 256, vec 4", "toy", {"block": 256, "vec": 4})
    store.queue_node(node.id, attempts=2)
    store.close()
    info = await h.search(Budget(max_iterations=3)).run()
    lost = h.store.node(node.id)
    assert lost.status == "failed" and lost.failure == "worker" and "lost in flight" in lost.reason
    assert info.failure_count == 1
    h.store.close()


def logs(events: list[EngineEvent], level: str) -> list[str]:
    return [e.text for e in events if isinstance(e, LogLine) and e.level == level]


async def test_bad_command_rows_and_unknown_nodes_are_ignored_with_a_log_line(tmp_path: Path) -> None:
    h = Harness(tmp_path, eval_seconds=0.05)
    search = h.search(Budget(max_iterations=12))
    events = search.subscribe()
    task = asyncio.create_task(search.run())
    await wait_for(events, lambda e: isinstance(e, NodeChanged) and e.node.status == "timed" and e.node.id > 1)
    await search.send(ExpandNode(node_id=999))
    raw = sqlite3.connect(h.run_dir / "run.sqlite")  # as a damaged file or a newer kernelforge would leave them
    raw.executemany(
        "INSERT INTO commands (kind, json, at) VALUES (?, ?, 0)",
        [("expand", "{not json"), ("warp", '{"kind": "warp", "node_id": 1}')],
    )
    raw.commit()
    raw.close()
    other = RunStore.open(h.run_dir)
    other.record_command(BanSubtree(node_id=12345))
    other.record_command(MarkExport(node_id=1))  # after the bad ones: still applied
    other.record_command(Stop())
    info = await asyncio.wait_for(task, 30)
    assert info.state == "finished" and "stopped by request" in info.reason
    warnings = logs(_drain(events), "warning")
    assert sum("no node 999 in this run: command ignored" in w for w in warnings) == 1
    assert sum("no node 12345 in this run: command ignored" in w for w in warnings) == 1
    assert sum("commands row" in w and "skipped" in w for w in warnings) == 2
    assert other.pending_commands() == [] and other.node(1).export
    other.close()
    h.store.close()


class ScriptedProposer(ToyProposer):
    """The toy proposer's seeds, then one scripted answer per expansion: a list to return, or an exception to raise."""

    def __init__(self, script: list[object]) -> None:
        super().__init__()
        self.script = script

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        self.contexts.append(ctx)
        answer = self.script.pop(0) if self.script else []
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]


async def test_the_search_survives_whatever_the_proposer_returns(tmp_path: Path) -> None:
    good = toy_kernel(512, 4)
    undecodable = toy_kernel(256, 4).source.replace("#define BLOCK", "// caf\udce9\n#define BLOCK")
    huge = toy_kernel(128, 4).source + "//" + "x" * (10 * 2**20) + "\n"
    script: list[object] = [
        RuntimeError("the model is overloaded"),
        [
            None,
            "a kernel, as text",
            good.model_copy(update={"source": undecodable, "mutation": "caf\udce9"}),
            good.model_copy(update={"source": huge}),
            good,
        ],
    ]
    h = Harness(tmp_path, ScriptedProposer(script))
    search = h.search(Budget(max_iterations=20), expand_batch=8, widening_k=10.0)
    events = search.subscribe()
    info = await search.run()
    assert info.state == "finished" and "nothing left to expand" in info.reason
    errors = logs(_drain(events), "error")
    assert sum("the proposer failed on node" in e and "RuntimeError: the model is overloaded" in e for e in errors) == 1
    assert sum("offered a NoneType, not a Proposal" in e for e in errors) == 1
    assert sum("offered a str, not a Proposal" in e for e in errors) == 1
    nodes = {n.id: n for n in h.store.nodes()}
    assert len(nodes) == 1 + 2 + 3  # the root, the seeds, and the three proposals
    failed = {n.reason: n for n in nodes.values() if n.status == "failed"}
    assert set(failed) == {
        "the source is not UTF-8 text (U+DCE9 on line 2)",
        f"the source is 10.5 MB, over the {MAX_SOURCE_BYTES / 2**20:g} MiB a candidate may have",
    }
    assert all(n.failure == "compile" for n in failed.values())
    kept, _ = h.store.node_source(next(n.id for n in failed.values() if "MB" in n.reason))
    assert len(kept) < 100_000 and kept.endswith(f"cut by kernelforge: {len(huge)} bytes in all\n")
    stored, _ = h.store.node_source(next(n.id for n in failed.values() if "UTF-8" in n.reason))
    assert "caf\\udce9" in stored and next(n for n in failed.values() if "UTF-8" in n.reason).mutation == "caf\\udce9"
    assert any(n.mutation == good.mutation and n.status == "timed" for n in nodes.values())
    h.store.close()


async def test_a_strategy_is_one_module_named_in_the_run_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(STRATEGIES, "root-only", "tests.support.fakes.root_only")
    h = Harness(tmp_path)
    search = h.search(Budget(max_iterations=20), strategy="root-only")
    assert type(search.strategy).__name__ == "RootOnly"
    info = await search.run()
    assert search.strategy.calls > 0  # type: ignore[attr-defined]
    root = h.store.nodes()[0].id
    assert all(n.parent_id == root for n in h.store.nodes()[1:])  # MCTS would have expanded the seeds too
    assert info.node_count > 3 and "nothing left to expand" in info.reason
    h.store.close()


async def test_a_failing_baseline_finishes_the_run_then_raises(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    (h.card.root / "baseline.cu").write_text(BASELINE + "// kf-simulate: fail=mismatch\n")
    with pytest.raises(BaselineFailed, match=r"the card's baseline failed to evaluate \(mismatch\)"):
        await h.search(Budget(max_iterations=6)).run()
    info = h.store.run_info()
    assert info.state == "finished" and "baseline failed" in info.reason and info.in_flight_count == 0
    h.store.close()


def _drain(queue: asyncio.Queue[EngineEvent]) -> list[EngineEvent]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


class NeighbourProposer(ToyProposer):
    """The toy's neighbours, less those anywhere in the tree (as the template proposer skips them): a node is
    exhausted only when every neighbour of it has been tried."""

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        everything = await super().propose(ctx, 7)
        return [p for p in everything if not ctx.tried_candidate(p)][:n]


async def test_pruned_branches_reopen_when_nothing_else_is_left_and_budget_remains(tmp_path: Path) -> None:
    """On the H200 a silu*up search ended after 49 of 1152 configurations with most of its minute left: every branch
    had been pruned for stagnation. With nothing else to expand, the pruned subtrees open again (said in the log),
    so the budget buys the rest of the toy grid; the run ends only when the reopened branches bring nothing new."""
    h = Harness(tmp_path, NeighbourProposer())
    search = h.search(Budget(max_iterations=40), prune_after=1, widening_k=1.0)
    events = search.subscribe()
    info = await search.run()
    tried = {(n.params["block"], n.params["vec"]) for n in search.tree.nodes.values() if n.params}
    assert tried == {(b, v) for b in BLOCKS for v in VECS}, (sorted(tried), info.reason, len(search.tree.nodes))
    assert any("the pruned subtrees are open again" in line for line in logs(_drain(events), "warning"))
    assert "nothing left to expand" in info.reason
    h.store.close()
