"""Where the TUI's data comes from: a small adapter over an in-process search or a run's store.

The app only talks to a `RunSource`. `LiveSearchSource` wraps a `Search` running in this process (its
event queue, its `send`), `StoreSource` follows a run's SQLite store (finished, or written live by
another process) by polling `events_since` a few times a second and steers it with `record_command`.
Both are plain Python: nothing here imports Textual, so the adapters can be tested on their own.
"""

from __future__ import annotations

import asyncio
import importlib
from collections import deque
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field, TypeAdapter

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.models.commands import EngineCommand
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
from kernelforge_tui.models.nodes import NodeView

LOG_KEEP = 500
_EVENT = TypeAdapter[EngineEvent](EngineEvent)


class RunHeader(BaseModel):
    """What the header line shows about a run, whichever source it came from."""

    run_id: str = ""
    run_dir: str = ""
    card_name: str = ""
    family: str = ""
    gpu_name: str = ""
    backend: str = ""
    state: SearchState = "starting"
    started_at: float | None = None
    ended_at: float | None = None
    best_node_id: int | None = None
    best_speedup: float | None = None


class Snapshot(BaseModel):
    """Everything needed to draw a run from scratch; later changes come as events."""

    header: RunHeader = Field(default_factory=RunHeader)
    nodes: list[NodeView] = Field(default_factory=list)
    budget: BudgetUsed | None = None
    logs: list[LogLine] = Field(default_factory=list)


@runtime_checkable
class RunSource(Protocol):
    """The TUI's whole view of a run."""

    @property
    def can_steer(self) -> bool:
        """Whether commands reach a search (False for a finished run)."""
        ...

    @property
    def in_process(self) -> bool:
        """Whether the search runs in this process (quitting must then stop it cleanly)."""
        ...

    def snapshot(self) -> Snapshot: ...

    def poll_events(self, limit: int = 5000) -> list[EngineEvent]:
        """Events since the last call, oldest first, without blocking."""
        ...

    async def send(self, command: EngineCommand) -> None: ...

    async def run(self) -> None:
        """Drive the search to its end (a no-op for a store that another process writes)."""
        ...

    async def close(self) -> None: ...

    def source(self, node_id: int) -> tuple[str, LaunchPlan] | None: ...

    def baseline_source(self) -> str | None: ...

    def evaluation(self, node_id: int) -> Evaluation | None: ...

    def profile(self, node_id: int) -> str | None: ...


def header_from(info: Any) -> RunHeader:
    """A `RunHeader` from the store's `RunInfo` (or anything with the same attributes)."""
    fields = {name: getattr(info, name) for name in RunHeader.model_fields if hasattr(info, name)}
    for name in ("run_id", "run_dir", "card_name", "family", "gpu_name", "backend"):
        if name in fields:
            fields[name] = "" if fields[name] is None else str(fields[name])
    if fields.get("state") not in ("starting", "running", "paused", "stopping", "finished"):
        # "interrupted" (the process died mid-run) and anything newer: not running now.
        fields["state"] = "finished"
    return RunHeader.model_validate(fields)


class _StoreReads:
    """Reads shared by both sources, from an object shaped like `kernelforge_tui.store.RunStore`."""

    store: Any

    def source(self, node_id: int) -> tuple[str, LaunchPlan] | None:
        if self.store is None:
            return None
        try:
            src, plan = self.store.node_source(node_id)
        except (KeyError, LookupError, ValueError):
            return None
        return str(src), plan

    def baseline_source(self) -> str | None:
        if self.store is None:
            return None
        getter = getattr(self.store, "baseline_source", None)
        if callable(getter):
            found = getter()
            if isinstance(found, tuple):
                found = found[0]
            return None if found is None else str(found)
        roots = [n for n in self.store.nodes() if n.parent_id is None]
        if not roots:
            return None
        got = self.source(min(n.id for n in roots))
        return got[0] if got else None

    def evaluation(self, node_id: int) -> Evaluation | None:
        if self.store is None:
            return None
        found = self.store.evaluation(node_id)
        return found if isinstance(found, Evaluation) or found is None else Evaluation.model_validate(found)

    def profile(self, node_id: int) -> str | None:
        if self.store is None:
            return None
        getter = getattr(self.store, "profile", None)
        return getter(node_id) if callable(getter) else None


def describe(event: EngineEvent, previous_status: str | None) -> LogLine | None:
    """The log line an event deserves beyond the engine's own log lines: what a proposer tried, each
    failure with its error (a compiler error keeps its offending line), new bests and state changes."""
    if isinstance(event, NodeAdded | NodeChanged):
        node = event.node
        if isinstance(event, NodeAdded) and node.mutation:
            parent = f" on #{node.parent_id}" if node.parent_id is not None else ""
            return LogLine(at=event.at, level="debug", node_id=node.id,
                           text=f"{node.proposer or 'proposer'} tried: {node.mutation}{parent}")  # fmt: skip
        if node.status == "failed" and previous_status != "failed":
            return LogLine(at=event.at, level="error", node_id=node.id,
                           text=f"{node.failure or 'failed'}: {node.reason}".rstrip(": "))  # fmt: skip
        return None
    if isinstance(event, BestImproved):
        return LogLine(at=event.at, node_id=event.node_id,
                       text=f"new best: {event.speedup:.2f}x ({event.latency_us:.2f} us)")  # fmt: skip
    if isinstance(event, StateChanged):
        return LogLine(at=event.at, text=f"search {event.state}" + (f": {event.reason}" if event.reason else ""))
    return None


def _replay(store: Any, snapshot: Snapshot, after: int = 0, page: int = 2000) -> int:
    """Fold the store's event log into `snapshot` (budget, state, recent logs); the last event id."""
    logs: deque[LogLine] = deque(snapshot.logs, maxlen=LOG_KEEP)
    status: dict[int, str] = {}
    while True:
        batch = store.events_since(after, page)
        for event_id, event in batch:
            after = max(after, int(event_id))
            line = describe(event, status.get(event.node.id) if isinstance(event, NodeAdded | NodeChanged) else None)
            if line is not None:
                logs.append(line)
            if isinstance(event, NodeAdded | NodeChanged):
                status[event.node.id] = event.node.status
            if isinstance(event, LogLine):
                logs.append(event)
            elif isinstance(event, BudgetUsed):
                snapshot.budget = event
            elif isinstance(event, StateChanged):
                snapshot.header.state = event.state
            elif isinstance(event, BestImproved):
                snapshot.header.best_node_id, snapshot.header.best_speedup = event.node_id, event.speedup
        if len(batch) < page:
            break
    snapshot.logs = list(logs)
    return after


def _live(info: Any) -> bool:
    return getattr(info, "ended_at", None) is None and getattr(info, "state", "") not in ("finished", "interrupted")


class StoreSource(_StoreReads):
    """A run read from its store: finished, or followed live while another process writes it."""

    in_process = False

    def __init__(self, store: Any) -> None:
        self.store = store
        self._after = 0
        self._closed = False

    @classmethod
    def open(cls, run_dir: Path | str) -> StoreSource:
        """Open a run read-only; a run still live in another process is reopened writable, to steer it."""
        module = importlib.import_module("kernelforge_tui.store")
        store = module.RunStore.open(Path(run_dir), readonly=True)
        if _live(store.run_info()):
            store.close()
            store = module.RunStore.open(Path(run_dir), readonly=False)
        return cls(store)

    @property
    def can_steer(self) -> bool:
        return not self._closed and not getattr(self.store, "readonly", False) and _live(self.store.run_info())

    def snapshot(self) -> Snapshot:
        snap = Snapshot(header=header_from(self.store.run_info()), nodes=list(self.store.nodes()))
        self._after = _replay(self.store, snap)
        return snap

    def poll_events(self, limit: int = 5000) -> list[EngineEvent]:
        if self._closed:
            return []
        batch = self.store.events_since(self._after, limit)
        if batch:
            self._after = max(int(i) for i, _ in batch)
        return [e if not isinstance(e, dict) else _EVENT.validate_python(e) for _, e in batch]

    async def send(self, command: EngineCommand) -> None:
        """The search in the other process reads recorded commands from the store."""
        self.store.record_command(command)

    async def run(self) -> None:
        return None

    async def close(self) -> None:
        """Detach: the other process's search carries on untouched."""
        if not self._closed:
            self._closed = True
            closer = getattr(self.store, "close", None)
            if callable(closer):
                closer()


class LiveSearchSource(_StoreReads):
    """A search running in this process, subscribed to before it starts so no event is missed."""

    in_process = True

    def __init__(self, search: Any, store: Any = None, header: RunHeader | None = None) -> None:
        self.search = search
        self.store = store if store is not None else getattr(search, "store", None)
        self.queue: asyncio.Queue[EngineEvent] = search.subscribe()
        self._header = header or RunHeader()
        self._done = False

    @property
    def can_steer(self) -> bool:
        return not self._done

    def snapshot(self) -> Snapshot:
        if self.store is None:
            return Snapshot(header=self._header)
        try:
            header = header_from(self.store.run_info())
        except (LookupError, ValueError, AttributeError):
            header = self._header
        return Snapshot(header=header, nodes=list(self.store.nodes()))

    def poll_events(self, limit: int = 5000) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        while len(out) < limit:
            try:
                out.append(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return out

    async def send(self, command: EngineCommand) -> None:
        await self.search.send(command)

    async def run(self) -> None:
        try:
            await self.search.run()
        finally:
            self._done = True

    async def close(self) -> None:
        self._done = True
