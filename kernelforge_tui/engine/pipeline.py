"""The pipeline: candidates from proposal to verdict, builds running ahead of the GPU lanes.

Why a pipeline: nvcc takes about a second per candidate and a GPU evaluation about as long, so several
builds run at once (through the backend's shared, cached Builder) and built candidates queue per GPU
lane; the GPU never waits on the compiler. Each candidate is in the store before it is queued, so a crash
loses only the candidates in flight, which a resume queues again.

Untrusted proposals: whatever a proposer returns becomes a node or one log line, never an error that ends
the search. A source the store cannot hold as it is (not UTF-8 text, or over the size a candidate may
have) is stored cut down to what can be shown and fails at once, without reaching nvcc.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from kernelforge_tui.build.source_policy import MAX_SOURCE_BYTES
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.engine.backend import EVALUATING, ElasticBackend, EvaluationBackend, PipelinedBackend
from kernelforge_tui.engine.events import EventBus
from kernelforge_tui.engine.settings import PipelineSettings
from kernelforge_tui.engine.tree import Tree
from kernelforge_tui.proposers.base import Proposal
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.events import NodeAdded, NodeChanged
from kernelforge_tui.vocabulary.identity import SourceIdentity, TemplateIdentity, candidate_key
from kernelforge_tui.vocabulary.nodes import FailureKind, NodeStatus

STORED_SOURCE_CHARS = 64 * 1024
"""How much of an oversized source is kept in the store, to show what the proposer sent."""
MAX_LABEL_CHARS = 500
"""A mutation or proposer name is cut to this length (a view shows them on one line)."""


class Priority(IntEnum):
    """The order candidates are built and evaluated in: what a person asked for first."""

    STEERED = 0
    NORMAL = 1


def _as_text(text: str) -> tuple[str, str | None]:
    """`text` as UTF-8 the store can hold (unencodable characters escaped), and what was wrong with it."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        problem = f"the source is not UTF-8 text (U+{ord(text[exc.start]):04X} on line {line})"
        return text.encode(errors="backslashreplace").decode(), problem
    return text, None


def screen(proposal: Proposal) -> tuple[Proposal, str | None]:
    """The proposal as the store can hold it, and why it cannot be built (None: it goes to the builder)."""
    source, problem = _as_text(proposal.source)
    size = len(source.encode())
    if size > MAX_SOURCE_BYTES:
        problem = f"the source is {size / 1e6:.1f} MB, over the {MAX_SOURCE_BYTES / 2**20:g} MiB a candidate may have"
        source = source[:STORED_SOURCE_CHARS] + f"\n// ... cut by kernelforge: {size} bytes in all\n"
    mutation = _as_text(proposal.mutation)[0][:MAX_LABEL_CHARS]
    proposer = _as_text(proposal.proposer)[0][:MAX_LABEL_CHARS]
    if (source, mutation, proposer) == (proposal.source, proposal.mutation, proposal.proposer):
        return proposal, problem
    return proposal.model_copy(update={"source": source, "mutation": mutation, "proposer": proposer}), problem


class Pipeline:
    """Adds candidates to the run, builds them ahead, evaluates them on the GPU lanes; each verdict goes to
    `on_done(node_id, evaluation)`, which records it (and must call `landed`)."""

    def __init__(
        self,
        card: OperatorCard,
        backend: EvaluationBackend,
        store: RunStore,
        tree: Tree,
        bus: EventBus,
        settings: PipelineSettings,
        running: asyncio.Event,
        on_done: Callable[[int, Evaluation], None],
    ) -> None:
        """`card`: the run's, which candidate keys are of. `running`: cleared while the search is paused (no new
        evaluation starts)."""
        self.card = card
        self.backend = backend
        self.store = store
        self.tree = tree
        self.bus = bus
        self.settings = settings
        self.running = running
        self.on_done = on_done
        self.lanes = 1
        self.max_in_flight = 1
        self.on_lanes: list[Callable[[int], None]] = []
        """Told the number of GPU lanes whenever it changes (the meter's busy share divides by it)."""
        self._resize(backend.lanes if isinstance(backend, PipelinedBackend) else 1)
        self.flying: set[int] = set()
        """Nodes handed to the pipeline and not yet recorded."""
        self.closed = False
        """New work is withdrawn (a clock budget was reached): nothing more is built or starts on a GPU."""
        self._attempts: dict[int, int] = {}
        self._building: set[int] = set()
        self._keys: dict[str, int] = {}
        """Each candidate's key (`candidate_key`) -> the node that holds it."""
        self._seq = itertools.count()
        self._build_q: asyncio.PriorityQueue[tuple[int, int, int]] = asyncio.PriorityQueue()
        self._gpu_q: asyncio.PriorityQueue[tuple[int, int, int]] = asyncio.PriorityQueue()

    def remember(self, node_id: int, identity: TemplateIdentity | SourceIdentity) -> None:
        """A candidate already in the run (a resume): never evaluated again, and named to proposers."""
        self._keys.setdefault(candidate_key(identity, self.card), node_id)

    def tried_candidates(self) -> set[str]:
        """The keys of every candidate in the run."""
        return set(self._keys)

    def submit(
        self, parent_id: int | None, proposal: Proposal, priority: Priority, allow_duplicate: bool = False
    ) -> int | None:
        """Add a candidate to the run and queue it; None for a duplicate (the same identity: vocabulary/identity.py),
        whose LLM calls are linked to the node that holds it (the conversation there shows them, and who wrote the
        same kernel)."""
        proposal, problem = screen(proposal)
        identity = proposal.candidate()
        key = candidate_key(identity, self.card)
        if key in self._keys and not allow_duplicate:
            if proposal.llm_calls:
                same, calls = self._keys[key], len(proposal.llm_calls)
                self.store.link_llm_calls(same, proposal.llm_calls)
                self.bus.log(
                    f"a candidate for node {parent_id} by {proposal.proposer} is the same as node {same}: dropped, "
                    f"its {calls} LLM call{'s' * (calls != 1)} linked to node {same}",
                    "debug",
                    parent_id,
                )
            return None
        repair_of = proposal.repair_of if proposal.repair_of in self.tree else None
        judge = proposal.judge_score
        judge = judge if judge is not None and 0 <= judge <= 1 else None
        view = self.store.add_node(
            parent_id,
            proposal.source,
            proposal.plan,
            proposal.mutation,
            proposal.proposer,
            proposal.params,
            repair_of=repair_of,
            judge_score=judge,
            llm_calls=proposal.llm_calls,
            identity=identity,
        )
        self.remember(view.id, identity)
        self.tree.add(view.id, parent_id, proposal.params, proposal.mutation, repair_of)
        self.bus.emit(NodeAdded(node=view))
        if proposal.rejected is not None:
            reason = f"the model's reply could not be used (kept as the source): {proposal.rejected}"
            self.on_done(view.id, Evaluation(ok=False, failure=FailureKind.MALFORMED, reason=reason))
        elif problem is not None:
            self.on_done(view.id, Evaluation(ok=False, failure=FailureKind.COMPILE, reason=problem))
        else:
            self.enqueue(view.id, priority, 1)
        return view.id

    def enqueue(self, node_id: int, priority: Priority, attempts: int) -> None:
        """Hand a stored node to the pipeline (`attempts`: the how-many-th time, counting resumes)."""
        self.flying.add(node_id)
        self._attempts[node_id] = attempts
        self.store.queue_node(node_id, attempts)
        self._build_q.put_nowait((priority, next(self._seq), node_id))

    def landed(self, node_id: int) -> None:
        """The node's verdict is recorded: it no longer counts as in flight."""
        self.flying.discard(node_id)
        self._attempts.pop(node_id, None)

    def withdraw(self) -> list[int]:
        """Take back the work not yet on a GPU lane (a clock budget was reached): the queued candidates and those
        being built leave the pipeline at once (a build's end is not waited for: its nvcc is stopped with the
        search, and a resume finds what it cached). Each stays in the store as proposed, handed over one time
        fewer, so a resume evaluates it as if this session had never taken it. Returns the candidates withdrawn."""
        self.closed = True
        withdrawn = sorted(self._building)
        for queue in (self._build_q, self._gpu_q):
            while not queue.empty():
                withdrawn.append(queue.get_nowait()[2])
        for node_id in withdrawn:
            self._give_back(node_id)
        return withdrawn

    def _give_back(self, node_id: int) -> None:
        attempts = self._attempts.get(node_id, 1)
        self.tree[node_id].status = NodeStatus.PROPOSED
        self.bus.emit(NodeChanged(node=self.store.queue_node(node_id, max(0, attempts - 1))))
        self.landed(node_id)

    def _resize(self, lanes: int) -> None:
        """As many GPU lanes as the backend has GPUs; the candidates in flight follow, unless set by hand."""
        self.lanes = lanes
        self.max_in_flight = self.settings.max_in_flight or self.settings.build_parallel + 2 * lanes
        for listener in self.on_lanes:
            listener(lanes)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The build workers and the GPU lanes."""
        builds = [asyncio.create_task(self._builder(), name=f"build-{i}") for i in range(self.settings.build_parallel)]
        return [*builds, asyncio.create_task(self._lanes(), name="gpu-lanes")]

    async def _lanes(self) -> None:
        """One evaluation loop per GPU lane. An elastic backend's lanes follow its GPUs: a lane is added for a GPU
        that comes, and one retires (after the candidate it holds) when a GPU goes; the work waits in between."""
        backend = self.backend
        if isinstance(backend, PipelinedBackend):
            self._resize(backend.lanes)  # a backend knows its GPUs once started
        running: dict[int, asyncio.Task[None]] = {}
        watch = asyncio.create_task(backend.lanes_changed(self.lanes)) if isinstance(backend, ElasticBackend) else None
        try:
            while True:
                for index in range(self.lanes):
                    if index not in running:
                        running[index] = asyncio.create_task(self._gpu_lane(index), name=f"gpu-{index}")
                waiting: set[asyncio.Task[Any]] = set(running.values())
                if watch is not None:
                    waiting.add(watch)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for index, task in list(running.items()):
                    if task in done:
                        del running[index]
                        task.result()  # a lane's own error ends the search, as any task's
                if watch is not None and watch in done:
                    assert isinstance(backend, ElasticBackend)
                    self._resize(watch.result())
                    self.bus.log(f"GPU lanes: {self.lanes} (the cluster's GPUs now)")
                    watch = asyncio.create_task(backend.lanes_changed(self.lanes))
        finally:
            leftover: list[asyncio.Task[Any]] = [*running.values(), *([watch] if watch is not None else [])]
            for task in leftover:
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)

    async def _builder(self) -> None:
        """Build ahead of the GPU: a failed build is recorded here and never reaches a GPU lane."""
        while True:
            priority, seq, node_id = await self._build_q.get()
            if isinstance(self.backend, PipelinedBackend):
                source, plan = self.store.node_source(node_id)
                self._building.add(node_id)
                try:
                    failed = await self.backend.build(source, plan)
                except Exception as exc:  # a broken build step fails this candidate, not the search
                    failed = Evaluation(ok=False, failure=FailureKind.COMPILE, reason=f"build error: {exc}")
                finally:
                    self._building.discard(node_id)
                if self.closed:  # withdrawn while it was built: a resume builds it again (from the cache)
                    continue
                if failed is not None:
                    self.on_done(node_id, failed)
                    continue
                self.tree.mark_built(node_id)
                self.bus.emit(NodeChanged(node=self.store.set_status(node_id, NodeStatus.BUILT)))
            if self.closed:
                self._give_back(node_id)
                continue
            self._gpu_q.put_nowait((priority, seq, node_id))

    async def _gpu_lane(self, index: int) -> None:
        """One evaluation at a time per GPU; a pause holds the next one back. Ends when the lanes shrink below it."""
        while index < self.lanes:
            await self.running.wait()
            _, _, node_id = await self._gpu_q.get()
            await self.running.wait()
            if self.closed:
                self._give_back(node_id)
                continue
            source, plan = self.store.node_source(node_id)
            EVALUATING.set(node_id)
            try:
                evaluation = await self.backend.evaluate(source, plan)
            except Exception as exc:  # a backend that raises fails this candidate, not the search
                reason = f"backend error: {type(exc).__name__}: {exc}"
                evaluation = Evaluation(ok=False, failure=FailureKind.WORKER, reason=reason)
            self.on_done(node_id, evaluation)
