"""How a search tells its views what happened: into the store first, then to in-process subscribers.

Why the store first: a view never sees what a crash could take back, and a view in another process (the
TUI following a live run) reads the same events from the store that an in-process view gets from its queue.
"""

from __future__ import annotations

import asyncio

from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.events import EPHEMERAL_KINDS, EngineEvent, LogLevel, LogLine, NodeChanged


class EventBus:
    """One run's events: stored, then queued for every subscriber."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._subscribers: list[asyncio.Queue[EngineEvent]] = []

    def subscribe(self) -> asyncio.Queue[EngineEvent]:
        """A queue that receives every event from now on (in-process views; others follow the store)."""
        queue: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._subscribers.append(queue)
        return queue

    def emit(self, event: EngineEvent) -> None:
        if event.kind not in EPHEMERAL_KINDS:
            self.store.append_event(event)
        for queue in self._subscribers:
            queue.put_nowait(event)

    def log(self, text: str, level: LogLevel = "info", node_id: int | None = None) -> None:
        self.emit(LogLine(text=text, level=level, node_id=node_id))

    def changed(self, node_id: int) -> None:
        """A node's stored view changed: send it whole."""
        self.emit(NodeChanged(node=self.store.node(node_id)))
