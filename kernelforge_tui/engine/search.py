"""The search: one run over one card, from the baseline to a budget, a Stop or an exhausted tree.

`Search` wires parts that each do one job: the `Pipeline` (builds ahead of the GPU lanes), the selection
`Strategy` (which node to expand: `engine/strategies/`), the `Scorer` (each node's reward), the
`ProfileScheduler` (which nodes ncu sees), the `Meter` (budgets), the `CommandHandler` (steering) and
`restore` (resuming from the store). What stays here is the driver, which selects and expands while there
is room, and the recording of each verdict: the tree first, then the store (one transaction), then the
views. Every step is committed before it is announced, so a view in another process sees what this one
sees, and a crash loses only the candidates in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from functools import partial

from kernelforge_tui.cards.directory import Card
from kernelforge_tui.config import ProfileSettings, RewardWeights
from kernelforge_tui.engine.backend import EvaluationBackend, target_gpu
from kernelforge_tui.engine.budget import Meter
from kernelforge_tui.engine.commands import CommandHandler
from kernelforge_tui.engine.events import EventBus
from kernelforge_tui.engine.feedback import NOTHING_TO_PROPOSE, cannot_serve
from kernelforge_tui.engine.llm_calls import RunCallSink
from kernelforge_tui.engine.pipeline import Pipeline, Priority
from kernelforge_tui.engine.profile_schedule import ProfileReason, ProfileScheduler
from kernelforge_tui.engine.promotion import timed_pair
from kernelforge_tui.engine.resume import lost, restore
from kernelforge_tui.engine.scoring import REASON_CHARS, Scorer
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.engine.strategies import make_strategy
from kernelforge_tui.engine.tree import Tree
from kernelforge_tui.errors import BadInput, BaselineFailed
from kernelforge_tui.llm import FatalLlmError, LlmClient, LlmError
from kernelforge_tui.proposers.base import (
    FailedSibling,
    LineageStep,
    ParentInfo,
    Proposal,
    ProposalContext,
    Proposer,
    SpaceCounter,
)
from kernelforge_tui.store import RunStore, UnreadableRecord
from kernelforge_tui.vocabulary.commands import EngineCommand
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.events import BestImproved, EngineEvent, NodeChanged, SearchState, StateChanged
from kernelforge_tui.vocabulary.nodes import FailureKind
from kernelforge_tui.vocabulary.runs import RunInfo

MAX_LLM_FAILURES = 3
"""Expansions in a row that fail on the LLM provider before the search stops (it is down, or the key was revoked)."""


class Search:
    """One run of the tree search over one card. Construct it on a new or an existing store, then `run()`."""

    def __init__(
        self,
        card: Card,
        proposer: Proposer,
        backend: EvaluationBackend,
        store: RunStore,
        settings: RunSettings,
        *,
        profile: ProfileSettings | None = None,
        reward: RewardWeights | None = None,
        llm: LlmClient | None = None,
    ) -> None:
        """`profile` and `reward`: `Settings.profile` and `Settings.reward` (defaults when None). `llm`: the client
        the proposer's agents ask through; the search records their calls and closes it when the run ends."""
        if card.spec.baseline is None:
            raise BadInput(f"card {card.spec.name} has no baseline kernel: the search starts from it (add [baseline])")
        self.card = card
        self.proposer = proposer
        self.backend = backend
        self.store = store
        self.settings = settings
        self.tree = Tree(settings.tree)
        self.strategy = make_strategy(settings.strategy, self.tree)
        self.bus = EventBus(store)
        self.running = asyncio.Event()
        """Cleared while paused: no evaluation or profile starts."""
        self.running.set()
        self.wake = asyncio.Event()
        """Set whenever the driver may have something new to do."""
        self.pipeline = Pipeline(
            card.spec, backend, store, self.tree, self.bus, settings.pipeline, self.running, self._record
        )
        profile = profile or ProfileSettings()
        self.scorer = Scorer(card, store, self.tree, reward or RewardWeights(), profile.classifier.threshold_pct)
        self.profiles = ProfileScheduler(
            backend, store, self.tree, self.bus, self.scorer, profile, self.running, self.wake
        )
        self.commands = CommandHandler(self)
        restored = restore(store, self.tree, self.pipeline)
        self.meter = Meter(settings.budget, restored.usage, self.pipeline.lanes)
        self.pipeline.on_lanes.append(self.meter.set_lanes)
        self.profiles.profiled = restored.profiled
        self._in_flight_at_start = restored.in_flight
        self.champion = restored.champion
        self.llm = llm
        if llm is not None:
            llm.sink = RunCallSink(store, self.bus, self.meter, self.wake)
        self.expansions: dict[int, asyncio.Task[None]] = {}
        """Expansions in progress (an LLM proposer writes for seconds), by node; cancelled on a pause or a stop."""
        self._reserved = 0
        """Children the expansions in progress may still add: counted against the iteration budget."""
        self._pooled = False
        """The team's pool has written first kernels for the root (its calls are in the store)."""
        self._llm_failures = 0
        """LLM expansions in a row that failed on the provider: a provider that keeps failing stops the search."""
        self.forced: deque[int] = deque()
        """Nodes a person asked to expand next (ExpandNode), ahead of the strategy's choice."""
        self.state: SearchState = "starting"
        self.stop_reason: str | None = None
        self.paused = False
        self._baseline_failed = False
        self._fatal: FatalLlmError | None = None
        """The provider error that stopped the run (a refused key): raised once the run is recorded."""
        self._nodes_at_reopening = 0
        """How many nodes the tree had when the pruned subtrees were last reopened (`_reopen_pruned`)."""

    # ---- views and steering -------------------------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[EngineEvent]:
        """A queue that receives every event from now on (in-process views; others follow the store)."""
        return self.bus.subscribe()

    async def send(self, cmd: EngineCommand) -> None:
        """Apply a command now (recorded in the store as applied)."""
        self.commands.send(cmd)

    def session_stats(self) -> tuple[float, float]:
        """(candidates per minute, GPU busy share) of this session so far."""
        return self.meter.session_stats()

    def _set_state(self, state: SearchState, reason: str = "") -> None:
        self.state = state
        self.store.set_state(state, reason, ended=state == "finished")
        self.bus.emit(StateChanged(state=state, reason=reason))

    def pause(self) -> None:
        """Hold every new evaluation and stop the budget's clock (paused time is not counted against it)."""
        if not self.paused and self.stop_reason is None:
            self.paused = True
            self.running.clear()
            self._cancel_expansions()
            self.store.add_active_seconds(self.meter.pause())
            self._set_state("paused", "paused by request")

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.meter.resume()
            self.running.set()
            self._set_state("running", "resumed by request")

    def stop(self, reason: str) -> None:
        """Stop proposing and let the candidates in flight finish (they are few: `max_in_flight`)."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        self._cancel_expansions()
        self.profiles.searching = False
        self.paused = False
        self.meter.resume()
        self.running.set()
        self._set_state("stopping", reason)
        self.wake.set()

    def _cancel_expansions(self) -> None:
        """Stop every proposer call at once (an LLM reply being written is abandoned, its call recorded)."""
        for task in self.expansions.values():
            task.cancel()

    # ---- running ------------------------------------------------------------------------------------

    async def run(self) -> RunInfo:
        """Start the backend, search until a budget, a Stop or an exhausted tree, close the backend.

        Raises BaselineFailed (after the run is recorded as finished) when the card's baseline did not build
        or evaluate, and FatalLlmError when a provider refused its key (the run is resumable once it is fixed)."""
        self.bus.emit(StateChanged(state="starting", reason="starting the evaluation backend"))
        try:
            await self.backend.start()
        except Exception as exc:
            self._set_state("finished", f"the evaluation backend did not start: {exc}")
            raise
        tasks: list[asyncio.Task[None]] = []
        finished = False
        try:
            self.meter.start_session()
            self._set_state("paused" if self.paused else "running", "resumed" if len(self.tree) else "started")
            self._start_or_resume()
            tasks += self.pipeline.tasks()
            tasks += [asyncio.create_task(self._ticker(), name="ticker")]
            tasks += [asyncio.create_task(self._poller(), name="poller")]
            tasks += [asyncio.create_task(self.profiles.run(), name="profiler")]
            driver = asyncio.create_task(self._driver(), name="driver")
            tasks.append(driver)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not driver and (error := task.exception()) is not None:
                    raise error
            await driver
            finished = True
        finally:
            self._cancel_expansions()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *self.expansions.values(), return_exceptions=True)
            if self.llm is not None:
                with contextlib.suppress(Exception):
                    await self.llm.aclose()
            self._account()
            with contextlib.suppress(Exception):
                await self.backend.close()
            if finished:
                self.bus.emit(self.meter.event())
                self._set_state("finished", self.stop_reason or "finished")
            else:
                self.store.set_state("interrupted", "the search was cancelled; resume it with --resume")
        if self._baseline_failed:
            raise BaselineFailed(self.stop_reason or "the card's baseline failed to evaluate")
        if self._fatal is not None:
            raise self._fatal
        return self.store.run_info()

    def _start_or_resume(self) -> None:
        if self.tree.root_id is None:
            baseline = self.card.spec.baseline
            assert baseline is not None
            source = self.card.baseline_source()
            root = Proposal(source=source, plan=baseline.plan, mutation="baseline (the card's)", proposer="card")
            self.pipeline.submit(None, root, Priority.STEERED)
            why = cannot_serve(self.proposer, self.card.spec)
            if why is not None:
                self.bus.log(f"the {self.proposer.name} proposer {why}", "warning")
            seeds = self.proposer.seeds(self.card)
            if self.settings.budget.max_iterations is not None:
                seeds = seeds[: self.settings.budget.max_iterations]
            assert self.tree.root_id is not None
            for seed in seeds:
                self.pipeline.submit(self.tree.root_id, seed, Priority.NORMAL)
            return
        given_up = 0
        for node_id, attempts in self._in_flight_at_start:
            failed = lost(attempts)
            if failed is not None:
                self._record(node_id, failed)
                given_up += 1
            else:
                self.pipeline.enqueue(node_id, Priority.STEERED, attempts + 1)
        if self._in_flight_at_start:
            requeued = len(self._in_flight_at_start) - given_up
            self.bus.log(f"resumed: {requeued} candidates in flight re-queued, {given_up} given up")

    async def _driver(self) -> None:
        """Select, expand, and decide when the search is over."""
        while True:
            reason = self.meter.exhausted()
            if reason is not None:
                self.stop(reason)
                if self.meter.clock_reached() and not self.pipeline.closed:
                    self._withdraw()
            if (
                self.stop_reason is not None
                and not self.pipeline.flying
                and not self.profiles.pending
                and not self.expansions
            ):
                return
            if self.stop_reason is None and not self.paused and await self._step():
                continue
            idle = not self.pipeline.flying and not self.expansions and not self.forced
            if self.stop_reason is None and idle and not self.paused:
                if self._release_pins() or self._reopen_pruned():
                    continue
                self.stop(self._nothing_left())
                continue
            self.wake.clear()
            timeout = self.settings.pipeline.poll_s
            left = self.meter.seconds_left()
            if left is not None and not self.paused:
                timeout = max(0.005, min(timeout, left))  # the time cap is noticed when it is reached
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.wake.wait()

    def _withdraw(self) -> None:
        """A clock cap is reached: no new work starts. The candidates not yet on a GPU and the queued profiles are
        dropped (the candidates stay in the run, evaluated first on a resume); those on a GPU finish."""
        withdrawn = self.pipeline.withdraw()
        self.profiles.dropped = True
        if withdrawn:
            ids = ", ".join(f"#{i}" for i in withdrawn)
            self.bus.log(
                f"{len(withdrawn)} candidates not yet on a GPU withdrawn ({ids}): they stay in the run, and a resume "
                "evaluates them first"
            )

    def _release_pins(self) -> bool:
        """Nothing is left to expand inside the pinned subtrees: unpin them (said in the log) so the search goes on
        over the whole tree instead of ending with budget left; False when nothing was pinned."""
        pinned = [n.id for n in self.tree.nodes.values() if n.pinned]
        if not pinned:
            return False
        for node_id in pinned:
            self.tree.pin(node_id, False)
            self.bus.emit(NodeChanged(node=self.store.set_pinned(node_id, False)))
        ids = ", ".join(f"#{i}" for i in pinned)
        self.bus.log(
            f"nothing left to expand inside the pinned subtrees ({ids}): unpinned, the search goes on over the whole "
            "tree",
            "warning",
        )
        return True

    def _reopen_pruned(self) -> bool:
        """Nothing is left to expand, but branches were pruned for stagnation: reopen them (said in the log), their
        stagnation counted from now, so that budget left buys more of the space instead of ending the run (on the
        H200 a silu*up search ended after 49 of 1152 configurations, with most of its minute left). Not again until
        the last reopening brought a new node: a tree whose reopened branches have nothing new ends."""
        if len(self.tree.nodes) == self._nodes_at_reopening:
            return False
        reopened = self.tree.reopen_pruned()
        if not reopened:
            return False
        self._nodes_at_reopening = len(self.tree.nodes)
        ids = ", ".join(f"#{i}" for i in reopened)
        self.bus.log(f"every open branch is spent: the pruned subtrees are open again ({ids})", "warning")
        return True

    def _nothing_left(self) -> str:
        """Why the search ends with budget left: the proposer's own reason when it cannot serve the card at all, and
        how much of its space the run covered when it can count it."""
        why = cannot_serve(self.proposer, self.card.spec)
        if why is not None:
            return f"{NOTHING_TO_PROPOSE}: the {self.proposer.name} proposer {why}"
        nothing_left = "nothing left to expand: every branch is exhausted, pruned or banned"
        if isinstance(self.proposer, SpaceCounter):
            tried = [node.params for node in self.tree.nodes.values()]
            coverage = self.proposer.coverage(self.card.spec, tried)
            if coverage is not None:
                return coverage.reason(nothing_left)
        return nothing_left

    async def _step(self) -> bool:
        """Start one expansion, if there is room and a node to expand; whether it started one."""
        if len(self.expansions) >= self.settings.pipeline.max_expanding:
            return False
        if not self.meter.may_propose(len(self.pipeline.flying) + self._reserved):
            return False
        target: int | None = None
        forced = False
        while self.forced:
            candidate = self.forced.popleft()
            if self.tree.may_expand(candidate):
                target, forced = candidate, True
                break
        root = self.tree.root_id
        if target is None and root is not None and self._first_expansion(root) and self.tree.may_expand(root):
            target = root  # the team's pool of first kernels, as soon as the baseline is measured
        if target is None:
            if len(self.pipeline.flying) >= self.pipeline.max_in_flight:
                return False
            target = self.strategy.select()
            if target is None:
                return False
        # An LLM team's first expansion of the root is its pool of first kernels: a whole batch, whatever the
        # widening allows (the root may already hold many template seeds).
        n = self.strategy.expansion_size(target, forced or self._first_expansion(target))
        if self.settings.budget.max_iterations is not None:
            left = self.settings.budget.max_iterations - self.meter.usage.iterations
            n = min(n, left - len(self.pipeline.flying) - self._reserved)
        n = max(n, 0)
        self.tree[target].expanding = True
        self._reserved += n
        task = asyncio.create_task(self._expand(target, forced, n), name=f"expand-{target}")
        self.expansions[target] = task
        task.add_done_callback(partial(self._expanded, target, n))
        return True

    def _first_expansion(self, node_id: int) -> bool:
        """The root, and no model has worked on it yet (with an LLM team)."""
        if self.llm is None or node_id != self.tree.root_id or self._pooled:
            return False
        self._pooled = bool(self.store.llm_calls(node_id))
        return not self._pooled

    def _expanded(self, node_id: int, n: int, task: asyncio.Task[None]) -> None:
        """An expansion ended (done, failed or cancelled, even before it started): the node may be selected again,
        its reserved children are released, and the driver is woken."""
        self.tree[node_id].expanding = False
        self._reserved -= n
        self.expansions.pop(node_id, None)
        self.wake.set()

    async def _expand(self, node_id: int, forced: bool, n: int) -> None:
        """Ask the proposer for children of the node; a proposer that fails or has nothing new exhausts it. A
        provider that fails does not exhaust the node (the next try may pass); three in a row stop the search."""
        try:
            proposals = await self.proposer.propose(self._context(node_id), n)
            offered = list(proposals[:n])
        except FatalLlmError as exc:  # every call would fail alike: stop now, not after three paid expansions
            self._fatal = self._fatal or exc
            self.stop(f"the LLM provider cannot be used: {exc}")
            return
        except LlmError as exc:
            if exc.kind == "budget":
                return  # the driver stops the search for the budget
            self._llm_failures += 1
            self.bus.log(f"the LLM failed while expanding node {node_id}: {exc}", "warning", node_id)
            if self._llm_failures >= MAX_LLM_FAILURES:
                self.stop(f"the LLM failed {self._llm_failures} times in a row; last: {exc}")
            return
        except Exception as exc:  # a broken proposer must not end the run; the node is not asked again
            self.tree[node_id].exhausted = True
            self.bus.log(f"the proposer failed on node {node_id}: {type(exc).__name__}: {exc}", "error", node_id)
            return
        self._llm_failures = 0
        added = 0
        priority = Priority.STEERED if forced else Priority.NORMAL
        for proposal in offered:
            if not isinstance(proposal, Proposal):
                self.bus.log(
                    f"the proposer offered a {type(proposal).__name__}, not a Proposal, for node {node_id}: skipped",
                    "error",
                    node_id,
                )
                continue
            for note in proposal.notes:
                self.bus.log(note, "warning", node_id)
            if self.pipeline.submit(node_id, proposal, priority) is not None:
                added += 1
        if added == 0:
            self.tree[node_id].exhausted = True
            self.bus.log(f"no new children for node {node_id}: it will not be expanded again", "debug", node_id)

    def _context(self, node_id: int) -> ProposalContext:
        record = self.store.node_record(node_id)
        try:
            profile = self.store.profile(node_id)
        except UnreadableRecord:
            profile = None
        failed: list[FailedSibling] = []
        for child in self.tree.failed_children(node_id):
            sibling = self.store.node_record(child.id)
            verdict = self.store.evaluation(child.id)
            failed.append(
                FailedSibling(
                    node_id=child.id,
                    summary=child.mutation,
                    params=child.params,
                    failure=child.failure or FailureKind.WORKER,
                    reason=child.reason,
                    source=sibling.source,
                    plan=sibling.plan,
                    proposer=sibling.proposer,
                    repair_round=self.tree.repair_round(child.id),
                    repair_of=sibling.repair_of,
                    repaired=self.tree.repaired(child.id),
                    diagnostics=verdict.build.diagnostics if verdict is not None and verdict.build is not None else [],
                )
            )
        evaluation = self.store.evaluation(node_id)
        build = evaluation.build if evaluation is not None else None
        lineage = [
            LineageStep(id=a.id, mutation=a.mutation, speedup=a.speedup)
            for a in reversed(list(self.tree.ancestors(node_id)))
        ]
        parent = ParentInfo(
            id=node_id,
            source=record.source,
            plan=record.plan,
            params=self.tree[node_id].params,
            latency_us=record.latency_us,
            speedup=record.speedup,
            ceiling_share=record.ceiling_share,
            profile=profile,
            ptxas=build.ptxas.get(record.plan.entry) if build is not None else None,
        )
        return ProposalContext(
            card=self.card.spec,
            card_dir=self.card.root,
            parent=parent,
            failed_siblings=failed,
            tried_children_params=self.tree.children_params(node_id),
            tried_candidates=self.pipeline.tried_candidates(),
            hints=self.tree.hints_for(node_id),
            best_speedup=self.champion.speedup,
            lineage=lineage,
            first_expansion=self._first_expansion(node_id),
            gpu=target_gpu(self.backend),
        )

    def _record(self, node_id: int, evaluation: Evaluation) -> None:
        """Record a verdict: the tree's statistics, the store (one transaction), then the events."""
        outcome = self.scorer.outcome(node_id, evaluation)
        verdict = self.champion.consider(node_id, outcome.speedup, timed_pair(evaluation))
        if verdict is not None and verdict.promoted:
            outcome = outcome.model_copy(update={"best": True})
        score = outcome.reward.total if outcome.reward is not None and outcome.failure is None else None
        pruned = self.tree.finish(node_id, outcome.status, outcome.speedup, outcome.failure, outcome.reason, score)
        ancestors = [a.id for a in self.tree.ancestors(node_id)]
        self.store.finish_node(node_id, evaluation, outcome, self.tree.stats(ancestors))
        self.pipeline.landed(node_id)
        is_root = node_id == self.tree.root_id
        self.meter.count(evaluation.result.gpu_seconds if evaluation.result else 0.0, candidate=not is_root)
        for ancestor in ancestors:
            self.bus.changed(ancestor)
        if outcome.failure is not None:
            reason = evaluation.reason[:REASON_CHARS]
            self.bus.log(f"node {node_id} failed ({outcome.failure}): {reason}", "info", node_id)
            if is_root:
                self._baseline_failed = True
                self.stop(f"the card's baseline failed to evaluate ({outcome.failure}): {reason}")
        for pruned_id in pruned:
            stalled = f"no improvement for {self.tree.settings.prune_after} visits"
            self.bus.log(f"pruned the subtree of node {pruned_id}: {stalled}", node_id=pruned_id)
        speedup = outcome.speedup
        if verdict is not None and not verdict.promoted:
            self.bus.log(f"node {node_id}: {verdict.text}", "info", node_id)
        if verdict is not None and verdict.promoted and speedup is not None:
            assert outcome.latency_us is not None
            self.bus.emit(
                BestImproved(
                    node_id=node_id,
                    speedup=speedup,
                    latency_us=outcome.latency_us,
                    ceiling_share=evaluation.ceiling_share,
                    speedup_interval=outcome.speedup_interval,
                    gain_interval=verdict.gain,
                )
            )
            if self.profiles.settings.new_best:
                self.profiles.request(node_id, ProfileReason.NEW_BEST)
        elif speedup is not None and self.profiles.settings.beats_parent:
            parent_id = self.tree[node_id].parent_id
            parent_speedup = self.tree[parent_id].speedup if parent_id is not None else None
            if parent_speedup is not None and speedup > parent_speedup:
                self.profiles.request(node_id, ProfileReason.BEATS_PARENT)
        self.wake.set()

    # ---- the clock and the mailbox ------------------------------------------------------------------

    def _account(self) -> None:
        self.store.add_active_seconds(self.meter.elapse())

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.settings.pipeline.stats_every_s)
            self._account()
            self.bus.emit(self.meter.event())
            if self.meter.exhausted() is not None:
                self.wake.set()

    async def _poller(self) -> None:
        while True:
            await asyncio.sleep(self.settings.pipeline.poll_s)
            self.commands.poll()
