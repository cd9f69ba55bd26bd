"""The search orchestrator: proposals, builds, GPU evaluations and storage as one asyncio pipeline.

Why a pipeline: nvcc takes about a second per candidate and a GPU evaluation about as long, so the
search keeps several builds running (through the backend's shared, cached Builder) and a queue of built
candidates per GPU lane; the GPU never waits on the compiler. Every step is committed to the run's store
before it is announced, so a view in another process sees what this one sees, and a crash loses only
the candidates in flight.

Profiling: the candidates that matter are profiled with Nsight Compute by a task of their own, never in
the way of evaluation: the card's baseline and each new best, each node faster than its parent, and any
node a person asks for (`ProfileNode`, queued first). On a GPU the profile holds that GPU's lane (ncu's
replays would disturb a timing), while proposals and builds go on. At most `max_pending` automatic
profiles wait (more are skipped) and automatic profiling holds a lane at most `max_share` of the time.
A typed profiling error (ncu missing, not permitted, unsupported, a timeout; or a backend that cannot
profile, such as the simulated one) is logged once and ends automatic profiling for the run.

Reward: each measured node is scored by `engine.reward.compute_reward` against its parent (speedup,
ptxas guardrails, and hardware evidence where both are profiled); every term is stored on the node, the
total steers the tree, and a profile that arrives later rescores the node and its children.

Resume: a Search built on a store that already holds nodes restores the tree by replaying them (nodes in
id order, outcomes in the order they were measured). Nodes that were in flight when the previous process
died (proposed or built, never measured) are re-queued once: their source and plan are in the store, and
the build cache makes the rebuild free. A node that was already re-queued once and is in flight again is
marked failed (kind "worker", reason "lost in flight"): it may be what killed the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections import deque
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.expr import ExprError
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.cards.store import Card
from kernelforge_tui.config import ProfileSettings, RewardWeights
from kernelforge_tui.engine.backend import EvaluationBackend, PipelinedBackend, ProfilingBackend
from kernelforge_tui.engine.budget import Budget, BudgetUsage
from kernelforge_tui.engine.mcts import Tree, TreeSettings
from kernelforge_tui.engine.reward import Evidence, compute_reward, failure_reward
from kernelforge_tui.gpu.profile import ProfileError, ProfileFailed, ProfilingUnavailable
from kernelforge_tui.models.commands import (
    AddHint,
    BanSubtree,
    EngineCommand,
    ExpandNode,
    InjectKernel,
    MarkExport,
    Pause,
    PinSubtree,
    ProfileNode,
    Resume,
    Stop,
)
from kernelforge_tui.models.evaluation import Evaluation
from kernelforge_tui.models.events import (
    BestImproved,
    BudgetUsed,
    EngineEvent,
    LogLine,
    NodeAdded,
    NodeChanged,
    SearchState,
    StateChanged,
)
from kernelforge_tui.models.nodes import NodeStatus
from kernelforge_tui.models.profiles import NodeProfile
from kernelforge_tui.models.rewards import Reward
from kernelforge_tui.models.runs import RunInfo, UnreadableRow
from kernelforge_tui.proposers.base import FailedSibling, ParentInfo, Proposal, ProposalContext, Proposer
from kernelforge_tui.store import RunStore

LOST_IN_FLIGHT = "lost in flight"
MAX_ATTEMPTS = 2
"""A node is handed to the pipeline at most this many times (the first run, then one resume)."""
PRIORITY_STEERED, PRIORITY_NORMAL = 0, 1
PROFILE_ASKED, PROFILE_NEW_BEST, PROFILE_BEATS_PARENT = 0, 1, 2
"""Profile queue priorities: a person's request first, then new bests, then nodes that beat their parent."""
PROFILE_FAILURES_IN_A_ROW = 3
"""Automatic profiling also stops after this many candidate-specific failures in a row (kind "failed")."""
LogLevel = Literal["debug", "info", "warning", "error"]


class PipelineSettings(BaseModel):
    """How much work the search keeps in flight."""

    model_config = ConfigDict(extra="forbid")

    max_in_flight: int | None = Field(default=None, ge=1)
    """Candidates proposed but not yet measured; default build_parallel + 2 per GPU lane."""
    build_parallel: int = Field(default=4, ge=1)
    """Builds running at once (nvcc processes; the Builder caps them as well)."""
    poll_s: float = Field(default=0.25, gt=0)
    """How often the store is polled for commands written by another process (the TUI)."""
    stats_every_s: float = Field(default=1.0, gt=0)
    """How often a BudgetUsed event is emitted and the wall-time budget checked."""


class RunSettings(BaseModel):
    """What a run records about how it searches (the store's settings JSON); a resume reads it back."""

    tree: TreeSettings = Field(default_factory=TreeSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    budget: Budget = Field(default_factory=Budget)
    proposer: str = ""
    app: dict[str, Any] = Field(default_factory=dict)
    """The kernelforge Settings the run started with, for the record."""


def source_key(source: str, plan: LaunchPlan) -> str:
    """Identity of a candidate: the same source with the same plan is never evaluated twice in a run."""
    return hashlib.sha256((source + "\0" + plan.model_dump_json()).encode()).hexdigest()


class Search:
    """One run of the tree search over one card. Construct it on a new or an existing store, then `run()`."""

    def __init__(
        self,
        card: Card,
        proposer: Proposer,
        backend: EvaluationBackend,
        store: RunStore,
        budget: Budget,
        settings: TreeSettings | None = None,
        pipeline: PipelineSettings | None = None,
        *,
        profile: ProfileSettings | None = None,
        reward: RewardWeights | None = None,
    ) -> None:
        """`profile` and `reward`: `Settings.profile` and `Settings.reward` (defaults when None). A failed
        node's reward is the tree's `failure_reward`, so the stored reward and the tree agree."""
        if card.spec.baseline is None:
            raise ValueError(
                f"card {card.spec.name} has no baseline kernel: the search starts from it (add [baseline])"
            )
        self.card = card
        self.proposer = proposer
        self.backend = backend
        self.store = store
        self.budget = budget
        self.tree = Tree(settings)
        self.pipeline = pipeline or PipelineSettings()
        self.lanes = backend.lanes if isinstance(backend, PipelinedBackend) else 1
        self.max_in_flight = self.pipeline.max_in_flight or self.pipeline.build_parallel + 2 * self.lanes
        self.usage = BudgetUsage()
        self.state: SearchState = "starting"
        self.stop_reason: str | None = None
        self._subscribers: list[asyncio.Queue[EngineEvent]] = []
        self._keys: set[str] = set()
        self._source_hashes: set[str] = set()
        self._flying: set[int] = set()
        self._forced: deque[int] = deque()
        self._best: tuple[int, float] | None = None
        self._requeue: list[tuple[int, int]] = []
        self._accounted = time.monotonic()
        self._seq = itertools.count()
        self._build_q: asyncio.PriorityQueue[tuple[int, int, int]] = asyncio.PriorityQueue()
        self._gpu_q: asyncio.PriorityQueue[tuple[int, int, int]] = asyncio.PriorityQueue()
        self._running = asyncio.Event()
        self._running.set()
        self._wake = asyncio.Event()
        self._paused = False
        self._session_t0 = time.monotonic()
        self._session_iterations = 0
        self._session_gpu_s = 0.0
        self.profile_settings = profile or ProfileSettings()
        self.weights = (reward or RewardWeights()).model_copy(update={"failure": self.tree.settings.failure_reward})
        self._profile_q: asyncio.PriorityQueue[tuple[int, int, int]] = asyncio.PriorityQueue()
        self._profile_waiting: dict[int, int] = {}
        """Queued node -> its priority; an entry evicted from here is skipped when it leaves the queue."""
        self._profiling: int | None = None
        self._profiled: set[int] = set()
        self.auto_profile = True
        """False once a profiling error ended automatic profiling for this run (ProfileNode still tries)."""
        self._profile_failures = 0
        self._profile_next_at = 0.0
        self._stop_now = False
        self._evidence: dict[int, Evidence] = {}
        self._restore()

    # ---- restoring a run ----------------------------------------------------------------------------

    def _restore(self) -> None:
        records = self.store.node_records()
        for rec in records:
            node = self.tree.add(rec.id, rec.parent_id, rec.params, rec.mutation)
            node.banned, node.pinned, node.hints = rec.banned, rec.pinned, list(rec.hints)
            self._keys.add(source_key(rec.source, rec.plan))
            self._source_hashes.add(hashlib.sha256(rec.source.encode()).hexdigest())
        done = sorted((r for r in records if r.last_measurement is not None and r.status not in ("proposed", "built")),
                      key=lambda r: r.last_measurement or 0)  # fmt: skip
        for rec in done:
            score = None
            if rec.reward is not None and rec.status != NodeStatus.FAILED:
                score = rec.reward.total
            self.tree.finish(rec.id, rec.status, rec.speedup, rec.failure, rec.reason, score)
            if rec.id != self.tree.root_id:
                self.usage.iterations += 1
        self._requeue = [(r.id, r.attempts) for r in records if r.status in ("proposed", "built")]
        self._profiled = self.store.profiled_ids() if records else set()
        best = self.tree.best_node()
        if best is not None and best.speedup is not None:
            self._best = (best.id, best.speedup)
        info = self.store.run_info() if records else None
        if info is not None:
            self.usage.elapsed_s = info.active_seconds
            self.usage.gpu_seconds = info.gpu_seconds

    # ---- views --------------------------------------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[EngineEvent]:
        """A queue that receives every event from now on (in-process views; others follow the store)."""
        queue: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._subscribers.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[EngineEvent]) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(queue)

    def _emit(self, event: EngineEvent) -> None:
        """Store first, then tell the subscribers: a view never sees what a crash could take back."""
        self.store.append_event(event)
        for queue in self._subscribers:
            queue.put_nowait(event)

    def _log(self, text: str, level: LogLevel = "info", node_id: int | None = None) -> None:
        self._emit(LogLine(text=text, level=level, node_id=node_id))

    def _set_state(self, state: SearchState, reason: str = "") -> None:
        self.state = state
        self.store.set_state(state, reason, ended=state == "finished")
        self._emit(StateChanged(state=state, reason=reason))

    # ---- commands -----------------------------------------------------------------------------------

    async def send(self, cmd: EngineCommand) -> None:
        """Apply a command now; it is recorded in the store (applied) so the run's history shows it."""
        command_id = self.store.record_command(cmd)
        self._apply(cmd)
        self.store.mark_applied(command_id)

    def _poll_commands(self) -> None:
        for command_id, cmd in self.store.pending_commands():
            if isinstance(cmd, UnreadableRow):
                self._emit(cmd.log_line())
            else:
                self._apply(cmd)
            self.store.mark_applied(command_id)

    def _known(self, node_id: int) -> bool:
        if node_id in self.tree:
            return True
        self._log(f"no node {node_id} in this run: command ignored", "warning")
        return False

    def _apply(self, cmd: EngineCommand) -> None:
        """What each command changes; synchronous, so a command is applied whole between two steps."""
        if isinstance(cmd, Pause):
            if not self._paused and self.stop_reason is None:
                self._paused = True
                self._running.clear()
                self._set_state("paused", "paused by request")
        elif isinstance(cmd, Resume):
            if self._paused:
                self._paused = False
                self._running.set()
                self._set_state("running", "resumed by request")
        elif isinstance(cmd, Stop):
            self._stop_now = True  # the profiles still queued are dropped
            self._stop("stopped by request")
        elif isinstance(cmd, ExpandNode):
            if self._known(cmd.node_id):
                if self.tree.expandable(self.tree[cmd.node_id], forced=True):
                    self._forced.append(cmd.node_id)
                    self._log(f"node {cmd.node_id} will be expanded next", node_id=cmd.node_id)
                else:
                    status = self.tree[cmd.node_id].status
                    self._log(f"node {cmd.node_id} cannot be expanded ({status}, or banned, or exhausted)",
                              "warning", cmd.node_id)  # fmt: skip
        elif isinstance(cmd, AddHint):
            if self._known(cmd.node_id):
                node = self.tree[cmd.node_id]
                node.hints.append(cmd.text)
                self.store.update_node(cmd.node_id, hints=node.hints)
                self._log(f"hint for node {cmd.node_id}: {cmd.text}", node_id=cmd.node_id)
        elif isinstance(cmd, InjectKernel):
            if self._known(cmd.parent_id):
                if self.stop_reason is not None:
                    self._log("the search is stopping: injected kernel not added", "warning", cmd.parent_id)
                else:
                    proposal = Proposal(source=cmd.source, plan=cmd.plan, mutation=cmd.note, proposer="hand")
                    self._add_candidate(cmd.parent_id, proposal, PRIORITY_STEERED, allow_duplicate=True)
        elif isinstance(cmd, BanSubtree):
            if self._known(cmd.node_id):
                self.tree.ban(cmd.node_id, cmd.banned)
                self._emit(NodeChanged(node=self.store.update_node(cmd.node_id, banned=cmd.banned)))
        elif isinstance(cmd, PinSubtree):
            if self._known(cmd.node_id):
                self.tree.pin(cmd.node_id, cmd.pinned)
                self._emit(NodeChanged(node=self.store.update_node(cmd.node_id, pinned=cmd.pinned)))
        elif isinstance(cmd, ProfileNode):
            if self._known(cmd.node_id):
                node = self.tree[cmd.node_id]
                if not node.measured:
                    self._log(f"node {cmd.node_id} is {node.status}: only a measured node can be profiled",
                              "warning", cmd.node_id)  # fmt: skip
                elif self._request_profile(cmd.node_id, PROFILE_ASKED):
                    self._log(f"node {cmd.node_id} will be profiled next", node_id=cmd.node_id)
        elif isinstance(cmd, MarkExport) and self._known(cmd.node_id):
            self._emit(NodeChanged(node=self.store.update_node(cmd.node_id, export=cmd.export)))
        self._wake.set()

    def _stop(self, reason: str) -> None:
        """Stop proposing and let the candidates in flight finish (they are few: `max_in_flight`)."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        self._paused = False
        self._running.set()
        self._set_state("stopping", reason)
        self._wake.set()

    # ---- the pipeline -------------------------------------------------------------------------------

    async def run(self) -> RunInfo:
        """Start the backend, search until a budget, a Stop or an exhausted tree, close the backend."""
        self._emit(StateChanged(state="starting", reason="starting the evaluation backend"))
        try:
            await self.backend.start()
        except Exception as exc:
            self._set_state("finished", f"the evaluation backend did not start: {exc}")
            raise
        tasks: list[asyncio.Task[None]] = []
        finished = False
        try:
            self._session_t0 = self._accounted = time.monotonic()
            self._set_state("paused" if self._paused else "running", "resumed" if len(self.tree) else "started")
            self._start_or_resume()
            tasks += [asyncio.create_task(self._builder(), name=f"build-{i}")
                      for i in range(self.pipeline.build_parallel)]  # fmt: skip
            tasks += [asyncio.create_task(self._gpu_lane(), name=f"gpu-{i}") for i in range(self.lanes)]
            tasks += [asyncio.create_task(self._ticker(), name="ticker")]
            tasks += [asyncio.create_task(self._poller(), name="poller")]
            tasks += [asyncio.create_task(self._profiler(), name="profiler")]
            driver = asyncio.create_task(self._driver(), name="driver")
            tasks.append(driver)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not driver and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            await driver
            finished = True
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._account_time()
            with contextlib.suppress(Exception):
                await self.backend.close()
            if finished:
                self._emit_budget()
                self._set_state("finished", self.stop_reason or "finished")
            else:
                self.store.set_state("interrupted", "the search was cancelled; resume it with --resume")
        return self.store.run_info()

    def _start_or_resume(self) -> None:
        if self.tree.root_id is None:
            baseline = self.card.spec.baseline
            assert baseline is not None
            root = Proposal(source=self.card.baseline_source(), plan=baseline.plan, mutation="baseline (the card's)",
                            proposer="card")  # fmt: skip
            self._add_candidate(None, root, PRIORITY_STEERED)
            seeds = self.proposer.seeds(self.card)
            if self.budget.max_iterations is not None:
                seeds = seeds[: self.budget.max_iterations]
            assert self.tree.root_id is not None
            for seed in seeds:
                self._add_candidate(self.tree.root_id, seed, PRIORITY_NORMAL)
            return
        lost = 0
        for node_id, attempts in self._requeue:
            if attempts >= MAX_ATTEMPTS:
                self._finish(
                    node_id, Evaluation(ok=False, failure="worker", reason=f"{LOST_IN_FLIGHT} {attempts} times")
                )
                lost += 1
            else:
                self._enqueue(node_id, PRIORITY_STEERED, attempts + 1)
        if self._requeue:
            self._log(f"resumed: {len(self._requeue) - lost} candidates in flight re-queued, {lost} given up")

    def _enqueue(self, node_id: int, priority: int, attempts: int) -> None:
        self._flying.add(node_id)
        self.store.update_node(node_id, attempts=attempts, status="proposed")
        self._build_q.put_nowait((priority, next(self._seq), node_id))

    def _add_candidate(
        self, parent_id: int | None, proposal: Proposal, priority: int, allow_duplicate: bool = False
    ) -> int | None:
        key = source_key(proposal.source, proposal.plan)
        if key in self._keys and not allow_duplicate:
            return None
        self._keys.add(key)
        self._source_hashes.add(hashlib.sha256(proposal.source.encode()).hexdigest())
        view = self.store.add_node(parent_id, proposal.source, proposal.plan, proposal.mutation, proposal.proposer,
                                   proposal.params)  # fmt: skip
        self.tree.add(view.id, parent_id, proposal.params, proposal.mutation)
        self._emit(NodeAdded(node=view))
        self._enqueue(view.id, priority, 1)
        return view.id

    async def _driver(self) -> None:
        """Select, expand, and decide when the search is over."""
        while True:
            reason = self.usage.exhausted(self.budget)
            if reason is not None:
                self._stop(reason)
            if self.stop_reason is not None and not self._flying and not self._profiles_pending():
                return
            if self.stop_reason is None and not self._paused and await self._step():
                continue
            if self.stop_reason is None and not self._flying and not self._forced and not self._paused:
                self._stop("nothing left to expand: every branch is exhausted, pruned or banned")
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.pipeline.poll_s)

    async def _step(self) -> bool:
        """One expansion, if there is room and a node to expand; whether it did one."""
        if not self.usage.may_propose(self.budget, len(self._flying)):
            return False
        forced = False
        target: int | None = None
        while self._forced:
            candidate = self._forced.popleft()
            if self.tree.expandable(self.tree[candidate], forced=True):
                target, forced = candidate, True
                break
        if target is None:
            if len(self._flying) >= self.max_in_flight:
                return False
            target = self.tree.select()
            if target is None:
                return False
        await self._expand(target, forced)
        return True

    def _context(self, node_id: int) -> ProposalContext:
        view = self.store.node(node_id)
        source, plan = self.store.node_source(node_id)
        node = self.tree[node_id]
        failed = [
            FailedSibling(
                node_id=c.id, summary=c.mutation, params=c.params, failure=c.failure or "worker", reason=c.reason
            )
            for c in self.tree.failed_children(node_id)
        ]
        return ProposalContext(
            card=self.card.spec, card_dir=self.card.root,
            parent=ParentInfo(id=node_id, source=source, plan=plan, params=node.params, latency_us=view.latency_us,
                              speedup=view.speedup, ncu_summary=self.store.profile(node_id)),
            failed_siblings=failed, tried_children_params=self.tree.children_params(node_id),
            tried_sources=set(self._source_hashes), hints=self.tree.hints_for(node_id),
            best_speedup=self._best[1] if self._best else None,
        )  # fmt: skip

    async def _expand(self, node_id: int, forced: bool) -> None:
        n = self.tree.expansion_size(node_id, forced)
        if self.budget.max_iterations is not None:
            n = min(n, self.budget.max_iterations - self.usage.iterations - len(self._flying))
        try:
            proposals = await self.proposer.propose(self._context(node_id), n)
        except Exception as exc:  # a broken proposer must not end the run; the node is not asked again
            self.tree[node_id].exhausted = True
            self._log(f"the proposer failed on node {node_id}: {type(exc).__name__}: {exc}", "error", node_id)
            return
        added = 0
        priority = PRIORITY_STEERED if forced else PRIORITY_NORMAL
        for proposal in proposals[: max(n, 0)]:
            if self._add_candidate(node_id, proposal, priority) is not None:
                added += 1
        if added == 0:
            self.tree[node_id].exhausted = True
            self._log(f"no new children for node {node_id}: it will not be expanded again", "debug", node_id)

    async def _builder(self) -> None:
        """Build ahead of the GPU: a failed build is finished here and never reaches a GPU lane."""
        while True:
            priority, seq, node_id = await self._build_q.get()
            if isinstance(self.backend, PipelinedBackend):
                source, plan = self.store.node_source(node_id)
                try:
                    failed = await self.backend.build(source, plan)
                except Exception as exc:
                    failed = Evaluation(ok=False, failure="compile", reason=f"build error: {exc}")
                if failed is not None:
                    self._finish(node_id, failed)
                    continue
                self.tree.mark_built(node_id)
                self._emit(NodeChanged(node=self.store.update_node(node_id, status="built")))
            self._gpu_q.put_nowait((priority, seq, node_id))

    async def _gpu_lane(self) -> None:
        """One evaluation at a time per GPU; a pause holds the next one back."""
        while True:
            await self._running.wait()
            _, _, node_id = await self._gpu_q.get()
            await self._running.wait()
            source, plan = self.store.node_source(node_id)
            try:
                evaluation = await self.backend.evaluate(source, plan)
            except Exception as exc:
                evaluation = Evaluation(
                    ok=False, failure="worker", reason=f"backend error: {type(exc).__name__}: {exc}"
                )
            self._finish(node_id, evaluation)

    def _finish(self, node_id: int, evaluation: Evaluation) -> None:
        """Record an outcome: tree statistics, the store (one transaction), then the events."""
        result = evaluation.result
        speedup = result.speedup if evaluation.ok and result else None
        latency = result.candidate.median_us if result and result.candidate else None
        if evaluation.ok:
            status = "timed" if speedup is not None else "verified"
            failure = None
        else:
            status, failure = "failed", evaluation.failure or "worker"
        reward: Reward | None = None
        if failure is not None:
            reward = failure_reward(failure, evaluation.reason[:300], self.weights)
        elif speedup is not None and speedup > 0:
            self._evidence[node_id] = self._measured_evidence(node_id, speedup, evaluation)
            reward = self._score(node_id)
        score = reward.total if reward is not None and failure is None else None
        pruned = self.tree.finish(node_id, status, speedup, failure, evaluation.reason, score)  # type: ignore[arg-type]
        ancestors = list(self.tree.ancestors(node_id))
        fields = {"status": status, "failure": failure, "reason": evaluation.reason, "latency": latency,
                  "speedup": speedup, "ceiling_share": evaluation.ceiling_share if evaluation.ok else None,
                  "reward_json": reward.model_dump_json() if reward is not None else None}  # fmt: skip
        self.store.finish_node(node_id, evaluation, fields, {a.id: (a.visits, a.mean) for a in ancestors})
        self._flying.discard(node_id)
        gpu_s = result.gpu_seconds if result else 0.0
        self.usage.gpu_seconds += gpu_s
        self._session_gpu_s += gpu_s
        is_root = node_id == self.tree.root_id
        if not is_root:
            self.usage.iterations += 1
            self._session_iterations += 1
        for ancestor in ancestors:
            self._emit(NodeChanged(node=self.store.node(ancestor.id)))
        if failure is not None:
            self._log(f"node {node_id} failed ({failure}): {evaluation.reason[:300]}", "info", node_id)
            if is_root:
                self._stop(f"the card's baseline failed to evaluate ({failure}): {evaluation.reason[:300]}")
        for pruned_id in pruned:
            self._log(f"pruned the subtree of node {pruned_id}: no improvement for {self.tree.settings.prune_after} "
                      "visits", "info", pruned_id)  # fmt: skip
        if speedup is not None and (self._best is None or speedup > self._best[1]):
            self._best = (node_id, speedup)
            assert latency is not None
            self._emit(BestImproved(node_id=node_id, speedup=speedup, latency_us=latency,
                                    ceiling_share=evaluation.ceiling_share))  # fmt: skip
            if self.profile_settings.new_best:
                self._request_profile(node_id, PROFILE_NEW_BEST)
        elif speedup is not None and self.profile_settings.beats_parent:
            parent_id = self.tree[node_id].parent_id
            parent_speedup = self.tree[parent_id].speedup if parent_id is not None else None
            if parent_speedup is not None and speedup > parent_speedup:
                self._request_profile(node_id, PROFILE_BEATS_PARENT)
        self._wake.set()

    # ---- reward -------------------------------------------------------------------------------------

    def _dynamic_shared(self, plan: LaunchPlan) -> int:
        try:
            return resolve(plan, self.card.spec).shared_bytes
        except ExprError:
            return 0

    def _measured_evidence(self, node_id: int, speedup: float, evaluation: Evaluation | None) -> Evidence:
        """What is known about a measured node: its speedup, its ptxas stats, its ncu metrics if profiled."""
        _, plan = self.store.node_source(node_id)
        build = evaluation.build if evaluation is not None else None
        ptxas = build.ptxas.get(plan.entry) if build is not None else None
        metrics: dict[str, float] | None = None
        if node_id in self._profiled:
            saved = self.store.profile(node_id)
            if saved is not None:
                with contextlib.suppress(ValueError):
                    metrics = NodeProfile.model_validate_json(saved).profile.values()
        return Evidence(speedup=speedup, metrics=metrics, ptxas=ptxas, dynamic_shared=self._dynamic_shared(plan))

    def _evidence_of(self, node_id: int) -> Evidence | None:
        """A measured node's evidence (from memory, else from the store: a resumed run)."""
        known = self._evidence.get(node_id)
        if known is not None:
            return known
        node = self.tree[node_id]
        if not node.measured or node.speedup is None or node.speedup <= 0:
            return None
        evidence = self._measured_evidence(node_id, node.speedup, self.store.evaluation(node_id))
        self._evidence[node_id] = evidence
        return evidence

    def _score(self, node_id: int) -> Reward | None:
        """The node's reward against its parent (alone for the root); None for a node with no speedup."""
        child = self._evidence_of(node_id)
        if child is None:
            return None
        parent_id = self.tree[node_id].parent_id
        parent = self._evidence_of(parent_id) if parent_id is not None else None
        threshold = self.profile_settings.classifier.threshold_pct
        return compute_reward(child, parent, weights=self.weights, threshold_pct=threshold)

    def _rescore(self, node_id: int) -> set[int]:
        """Score the node and its measured children again (a profile arrived); the nodes whose value moved."""
        rewards: dict[int, str] = {}
        touched: set[int] = set()
        for target in [node_id, *self.tree[node_id].children]:
            node = self.tree[target]
            if not node.measured:
                continue
            reward = self._score(target)
            if reward is None:
                continue
            self.tree.rescore(target, reward.total)
            rewards[target] = reward.model_dump_json()
            touched.update(a.id for a in self.tree.ancestors(target))
        stats = {i: (self.tree[i].visits, self.tree[i].mean) for i in touched}
        self.store.save_rewards(rewards, stats)
        return touched

    # ---- profiling ----------------------------------------------------------------------------------

    def _profiles_pending(self) -> bool:
        """Profiles queued or running that a finishing run still waits for (not after a Stop command)."""
        return not self._stop_now and (bool(self._profile_waiting) or self._profiling is not None)

    def _request_profile(self, node_id: int, priority: int) -> bool:
        """Queue a profile; automatic ones only while enabled, not twice, and at most `max_pending` waiting."""
        if node_id in self._profile_waiting or node_id == self._profiling:
            return False
        if priority != PROFILE_ASKED:
            if not self.auto_profile or node_id in self._profiled:
                return False
            if len(self._profile_waiting) >= self.profile_settings.max_pending and not self._evict_for(priority):
                self._log(f"node {node_id} not profiled: {len(self._profile_waiting)} profiles already wait "
                          "(profile settings: max_pending)", "debug", node_id)  # fmt: skip
                return False
        self._profile_waiting[node_id] = priority
        self._profile_q.put_nowait((priority, next(self._seq), node_id))
        return True

    def _evict_for(self, priority: int) -> bool:
        """Make room for a new best: drop a waiting profile of a node that only beat its parent, else the
        oldest waiting former best (it is no longer the best). Profiles a person asked for stay."""
        if priority != PROFILE_NEW_BEST:
            return False
        for worse in (PROFILE_BEATS_PARENT, PROFILE_NEW_BEST):
            for node_id, queued in self._profile_waiting.items():  # insertion order: oldest first
                if queued == worse:
                    del self._profile_waiting[node_id]
                    self._log(f"node {node_id}'s profile dropped for a new best (profile settings: max_pending)",
                              "debug", node_id)  # fmt: skip
                    return True
        return False

    async def _profiler(self) -> None:
        """Profile the queued nodes one at a time, beside the pipeline (the backend holds a GPU lane)."""
        while True:
            await self._running.wait()
            priority, _, node_id = await self._profile_q.get()
            if self._profile_waiting.get(node_id) != priority:
                continue  # evicted to make room for a new best
            asked = priority == PROFILE_ASKED
            if not asked:
                if not self.auto_profile:
                    self._profile_waiting.pop(node_id, None)
                    self._wake.set()
                    continue
                delay = self._profile_next_at - time.monotonic()
                if delay > 0 and self.stop_reason is None:  # a lane at most max_share of the time while searching
                    await asyncio.sleep(delay)
            self._profile_waiting.pop(node_id, None)
            self._profiling = node_id
            try:
                await self._profile(node_id, asked)
            finally:
                self._profiling = None
                self._wake.set()

    async def _profile(self, node_id: int, asked: bool) -> None:
        source, plan = self.store.node_source(node_id)
        latency = self.store.node(node_id).latency_us
        try:
            if not isinstance(self.backend, ProfilingBackend):
                raise ProfilingUnavailable(f"the {getattr(self.backend, 'name', 'evaluation')} backend cannot profile")
            profiled = await self.backend.profile(source, plan, latency)
        except ProfileError as exc:
            self._profile_failed(node_id, exc, asked)
            return
        except Exception as exc:  # a broken backend must not end the run
            self._profile_failed(node_id, ProfileFailed(f"{type(exc).__name__}: {exc}"), asked)
            return
        # The lane was held for ncu's run only (waiting for the lane does not count against the share).
        share = self.profile_settings.max_share
        self._profile_next_at = time.monotonic() + profiled.profile.seconds * (1 - share) / share
        self._profile_failures = 0
        self.store.save_profile(node_id, profiled.model_dump_json())
        self._profiled.add(node_id)
        node = self.tree[node_id]
        if node.status == "timed":
            node.status = NodeStatus.PROFILED
            self.store.update_node(node_id, status="profiled")
        self._evidence.pop(node_id, None)
        touched = self._rescore(node_id) | {node_id}
        for changed in sorted(touched):
            self._emit(NodeChanged(node=self.store.node(changed)))
        self._log(f"profiled node {node_id} in {profiled.profile.seconds:.1f} s: {profiled.hardware.summary()}",
                  node_id=node_id)  # fmt: skip

    def _profile_failed(self, node_id: int, exc: ProfileError, asked: bool) -> None:
        """Log a profiling error; one that is not about this candidate ends automatic profiling, once."""
        self._profile_failures += 1
        general = exc.kind != "failed" or self._profile_failures >= PROFILE_FAILURES_IN_A_ROW
        if general and self.auto_profile:
            self.auto_profile = False
            level: LogLevel = "info" if exc.kind == "unavailable" else "warning"
            self._log(f"node {node_id} not profiled: {exc}; automatic profiling is off for this run "
                      "(ProfileNode still tries)", level, node_id)  # fmt: skip
        elif asked or not general:
            self._log(f"node {node_id} not profiled: {exc}", "warning", node_id)

    def _account_time(self) -> None:
        now = time.monotonic()
        delta = now - self._accounted
        self._accounted = now
        self.usage.elapsed_s += delta
        self.store.add_active_seconds(delta)

    def _emit_budget(self) -> None:
        wall = max(time.monotonic() - self._session_t0, 1e-9)
        self._emit(
            BudgetUsed(
                iterations=self.usage.iterations, max_iterations=self.budget.max_iterations,
                elapsed_s=self.usage.elapsed_s,
                max_seconds=self.budget.max_minutes * 60 if self.budget.max_minutes is not None else None,
                gpu_seconds=self.usage.gpu_seconds, max_gpu_seconds=self.budget.max_gpu_seconds,
                candidates_per_minute=self._session_iterations / wall * 60,
                gpu_busy_share=min(1.0, self._session_gpu_s / (wall * self.lanes)),
            )
        )  # fmt: skip

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.pipeline.stats_every_s)
            self._account_time()
            self._emit_budget()
            if self.usage.exhausted(self.budget) is not None:
                self._wake.set()

    async def _poller(self) -> None:
        while True:
            await asyncio.sleep(self.pipeline.poll_s)
            self._poll_commands()

    def session_stats(self) -> tuple[float, float]:
        """(candidates per minute, GPU busy share) of this session so far."""
        wall = max(time.monotonic() - self._session_t0, 1e-9)
        return self._session_iterations / wall * 60, min(1.0, self._session_gpu_s / (wall * self.lanes))
