"""Where the TUI's data comes from: a search running in this process, or a run's store followed from outside.

The app knows a run only as a `RunSource`, with two implementations: `LiveSearchSource` wraps a search
running in this process (its event queue, its `send`); `StoreSource` follows a run's SQLite store,
finished or written live by another process, and steers it by recording commands there. The reads
(`snapshot`, `node_source`, `evaluation`, `profile`, `measured_on`, and the LLM reads of `LlmReads`) block on
SQLite, so the app makes them from thread workers and never on the UI loop; `poll_events` and `cluster_status` (the
workers of a cluster the search in this process measures on) never block the loop. No Textual here.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.engine.takeaway import write_kernel
from kernelforge_tui.engine.view import RunHeader, RunView, Snapshot
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import RunStore, UnknownNode, UnreadableRecord
from kernelforge_tui.vocabulary.commands import EngineCommand
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.events import EngineEvent, StateChanged
from kernelforge_tui.vocabulary.llm import LlmCall, ModelRecord
from kernelforge_tui.vocabulary.profiles import NodeProfile
from kernelforge_tui.vocabulary.rewards import Reward
from kernelforge_tui.vocabulary.runs import ClusterStatus, UnreadableRow

T = TypeVar("T")
NodeSource = tuple[str, LaunchPlan]
"""A node's kernel source and the plan that launches it."""
REPLAY_PAGE = 2000
LIVENESS_S = 2.0
"""How often an idle followed run is checked for a writer that died without saying so."""
KERNELS_DIR = "kernels"
"""The folder beside a run's directory where the TUI's export key writes kernels (one folder a node)."""


class ProfileRead(BaseModel):
    """A node's saved profile as the TUI sees it: the `NodeProfile`, or why it could not be read."""

    profile: NodeProfile | None = None
    error: str | None = None


def read_profile(store: RunStore, node_id: int) -> ProfileRead | None:
    """The node's saved profile (`RunStore.profile`), or why it cannot be read; None where it has none."""
    try:
        found = store.profile(node_id)
    except UnreadableRecord as exc:
        return ProfileRead(error=str(exc))
    return ProfileRead(profile=found) if found is not None else None


class RunSource(Protocol):
    """The TUI's whole view of a run."""

    @property
    def can_steer(self) -> bool:
        """Whether commands can reach a search at all (False for a run opened read-only); no I/O."""
        ...

    @property
    def in_process(self) -> bool:
        """Whether the search runs in this process (quitting must then stop it cleanly)."""
        ...

    def snapshot(self) -> Snapshot:
        """The run as it stands, to draw from scratch (blocking: call it from a thread)."""
        ...

    async def poll_events(self, limit: int = 5000) -> list[EngineEvent]:
        """Events since the last call, oldest first; never blocks the event loop."""
        ...

    async def send(self, command: EngineCommand) -> None: ...

    async def run(self) -> None:
        """Drive the search to its end (a no-op for a store that another process writes)."""
        ...

    async def close(self) -> None: ...

    def node_source(self, node_id: int) -> NodeSource | None:
        """The node's kernel and plan (blocking: call it from a thread)."""
        ...

    def evaluation(self, node_id: int) -> Evaluation | None:
        """The node's latest evaluation (blocking: call it from a thread)."""
        ...

    def profile(self, node_id: int) -> ProfileRead | None:
        """The node's saved ncu profile (blocking: call it from a thread)."""
        ...

    def reward(self, node_id: int) -> Reward | None:
        """The node's reward with every term (blocking: call it from a thread); None before it was measured."""
        ...

    def kernel_dir(self, node_id: int) -> Path:
        """Where the export key offers to write the node's kernel: `kernels/RUN-node-N` beside the run's directory
        (no I/O)."""
        ...

    def write_kernel(self, node_id: int, out_dir: Path) -> Path:
        """Write the node's kernel.cu, plan.toml and summary.md into `out_dir` (`engine.takeaway.write_kernel`;
        blocking: call it from a thread). BadInput when the directory cannot be written."""
        ...

    def cluster_status(self) -> ClusterStatus | None:
        """The cluster the search measures on, now: its workers, what each GPU is on, the throughput (no I/O).
        None unless the search runs on a cluster in this process (only its coordinator knows its workers)."""
        ...

    def measured_on(self) -> dict[str, int]:
        """How many evaluations each GPU measured, from the store (blocking: call it from a thread)."""
        ...


class AgentFacts(BaseModel):
    """What the agents left on a node: the judge's score of its edit, and the failed node it repairs."""

    judge_score: float | None = None
    repair_of: int | None = None


@runtime_checkable
class LlmReads(Protocol):
    """The LLM calls of a run, as its store keeps them (blocking: call them from a thread).

    A source without them (one that keeps no calls, like the template-only synthetic run of the tests and the
    benchmark) reads as a run without calls: `llm_reads` gives `NoLlmReads` for it."""

    def llm_calls(self, node_id: int) -> list[LlmCall]:
        """The calls that wrote node `node_id` or worked on it, in the order they were made."""
        ...

    def model_records(self) -> list[ModelRecord]:
        """How each provider's model fared in the run."""
        ...

    def agent_facts(self, node_id: int) -> AgentFacts | None: ...


class NoLlmReads:
    """A run without LLM calls."""

    def llm_calls(self, node_id: int) -> list[LlmCall]:
        return []

    def model_records(self) -> list[ModelRecord]:
        return []

    def agent_facts(self, node_id: int) -> AgentFacts | None:
        return None


def llm_reads(source: object) -> LlmReads:
    return source if isinstance(source, LlmReads) else NoLlmReads()


class ClusterStatusReader(Protocol):
    def status(self) -> ClusterStatus: ...


@runtime_checkable
class OnACluster(Protocol):
    """A backend that measures on a cluster: engine.cluster's ClusterBackend, known here by its shape (the TUI never
    imports the cluster's side, which needs Dask)."""

    @property
    def cluster(self) -> ClusterStatusReader: ...


class InProcessSearch(Protocol):
    """What the TUI needs of a search it drives: its events, its commands, and its backend (a cluster's status)."""

    @property
    def backend(self) -> object: ...

    def subscribe(self) -> asyncio.Queue[EngineEvent]: ...

    async def send(self, cmd: EngineCommand) -> None: ...

    async def run(self) -> object: ...


class _StoreReads:
    """The reads both sources make from a run's store: from any thread, and None once the store is closed."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._closed = False

    def _use(self, read: Callable[[RunStore], T]) -> T | None:
        with self._lock:
            return None if self._closed else read(self.store)

    def node_source(self, node_id: int) -> NodeSource | None:
        def read(store: RunStore) -> NodeSource | None:
            try:
                return store.node_source(node_id)
            except LookupError:
                return None

        return self._use(read)

    def evaluation(self, node_id: int) -> Evaluation | None:
        return self._use(lambda store: store.evaluation(node_id))

    def profile(self, node_id: int) -> ProfileRead | None:
        return self._use(lambda store: read_profile(store, node_id))

    def reward(self, node_id: int) -> Reward | None:
        def read(store: RunStore) -> Reward | None:
            try:
                return store.node_record(node_id).reward
            except UnknownNode:
                return None

        return self._use(read)

    def kernel_dir(self, node_id: int) -> Path:
        run_dir = self.store.run_dir
        return run_dir.parent / KERNELS_DIR / f"{run_dir.name}-node-{node_id}"

    def write_kernel(self, node_id: int, out_dir: Path) -> Path:
        written = self._use(lambda store: write_kernel(store, node_id, out_dir))
        if written is None:
            raise BadInput("the run is closed: nothing was written")
        return written

    def llm_calls(self, node_id: int) -> list[LlmCall]:
        return self._use(lambda store: store.llm_calls(node_id)) or []

    def model_records(self) -> list[ModelRecord]:
        return self._use(lambda store: store.model_records()) or []

    def agent_facts(self, node_id: int) -> AgentFacts | None:
        def read(store: RunStore) -> AgentFacts | None:
            try:
                record = store.node_record(node_id)
            except UnknownNode:
                return None
            return AgentFacts(judge_score=record.judge_score, repair_of=record.repair_of)

        return self._use(read)

    def measured_on(self) -> dict[str, int]:
        return self._use(lambda store: store.measured_on()) or {}


class StoreSource(_StoreReads):
    """A run read from its store: finished, or followed live while another process writes it."""

    in_process = False

    def __init__(self, store: RunStore) -> None:
        super().__init__(store)
        self._after = 0
        self._writer_alive = not store.readonly
        self._checked_at = time.monotonic()

    @classmethod
    def open(cls, run_dir: Path | str) -> StoreSource:
        """Open a run read-only; a run still live in another process is reopened writable, to steer it."""
        store = RunStore.open(Path(run_dir), readonly=True)
        try:
            store.verify()  # a damaged file is one line here, not an error halfway through the view
        except BaseException:
            store.close()
            raise
        if RunHeader.from_info(store.run_info()).state != "finished":
            store.close()
            store = RunStore.open(Path(run_dir), readonly=False)
        return cls(store)

    @property
    def can_steer(self) -> bool:
        return not self._closed and not self.store.readonly

    def snapshot(self) -> Snapshot:
        """The store's nodes and header, with the budget and log folded from its whole event log."""
        replay = RunView()
        self._after = 0
        while batch := self._events(REPLAY_PAGE):
            replay.apply(batch)
            if len(batch) < REPLAY_PAGE:
                break
        # Nodes and header after the events: a change in between arrives again with the next poll.
        found = self._use(lambda store: (store.nodes(), store.run_info(), store.llm_totals()))
        if found is None:
            return Snapshot()
        nodes, info, totals = found
        header = RunHeader.from_info(info)
        return Snapshot(
            header=header,
            nodes=nodes,
            budget=replay.budget,
            logs=list(replay.logs),
            llm_totals=totals,
            # A call started and never ended in a finished run died with its process.
            calls_in_flight=[live.as_event() for live in replay.calls.values()] if header.state != "finished" else [],
            ended_calls=list(replay.ended_calls),
        )

    def _events(self, limit: int) -> list[EngineEvent]:
        batch = self._use(lambda store: store.events_since(self._after, limit)) or []
        if batch:
            self._after = batch[-1][0]
        return [event.log_line() if isinstance(event, UnreadableRow) else event for _, event in batch]

    def _poll(self, limit: int) -> list[EngineEvent]:
        events = self._events(limit)
        if events or not self._writer_alive or time.monotonic() - self._checked_at < LIVENESS_S:
            return events
        self._checked_at = time.monotonic()
        info = self._use(lambda store: store.run_info())
        if info is None or RunHeader.from_info(info).state != "finished":
            return []
        self._writer_alive = False
        # The writer died (kill -9) without a last event: say so, or the view would wait for it forever.
        return [StateChanged(state="finished", reason=f"{info.state}: resume it with `optimize --resume`")]

    async def poll_events(self, limit: int = 5000) -> list[EngineEvent]:
        return await asyncio.to_thread(self._poll, limit)

    async def send(self, command: EngineCommand) -> None:
        """The search in the other process reads recorded commands from the store."""
        await asyncio.to_thread(self._use, lambda store: store.record_command(command))

    async def run(self) -> None:
        return None

    def cluster_status(self) -> ClusterStatus | None:
        """None: the workers are known only to the process that runs the search."""
        return None

    async def close(self) -> None:
        """Detach: the other process's search carries on untouched."""
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self.store.close()


class LiveSearchSource(_StoreReads):
    """A search running in this process, subscribed to before it starts so no event is missed.

    `store` is the search's own; whoever made the search closes it, after the app."""

    in_process = True

    def __init__(self, search: InProcessSearch, store: RunStore) -> None:
        super().__init__(store)
        self.search = search
        self.queue = search.subscribe()
        self._done = False

    @property
    def can_steer(self) -> bool:
        return not self._done

    def snapshot(self) -> Snapshot:
        found = self._use(lambda store: (store.nodes(), store.run_info(), store.llm_totals()))
        if found is None:
            return Snapshot()
        nodes, info, totals = found
        return Snapshot(header=RunHeader.from_info(info), nodes=nodes, llm_totals=totals)

    async def poll_events(self, limit: int = 5000) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        while len(out) < limit:
            try:
                out.append(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return out

    async def send(self, command: EngineCommand) -> None:
        await self.search.send(command)

    def cluster_status(self) -> ClusterStatus | None:
        backend = self.search.backend
        return backend.cluster.status() if isinstance(backend, OnACluster) else None

    async def run(self) -> None:
        try:
            await self.search.run()
        finally:
            self._done = True

    async def close(self) -> None:
        self._done = True
