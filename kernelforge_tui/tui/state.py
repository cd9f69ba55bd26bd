"""The run as the TUI holds it: nodes, their children, the best path, budget and state.

Plain Python, no Textual: events are folded in batches and each batch says what changed, so widgets
redraw only that.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from kernelforge_tui.models.events import (
    BestImproved,
    BudgetUsed,
    EngineEvent,
    LogLine,
    NodeAdded,
    NodeChanged,
    StateChanged,
)
from kernelforge_tui.models.nodes import NodeView
from kernelforge_tui.tui.source import LOG_KEEP, RunHeader, Snapshot, describe


@dataclass
class Changes:
    """What one batch of events changed."""

    added: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    best_before: int | None = None
    best_changed: bool = False
    logs: list[LogLine] = field(default_factory=list)
    header: bool = False

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.best_changed or self.logs or self.header)


class RunState:
    """Nodes by id, children by parent, and the run's header facts."""

    def __init__(self) -> None:
        self.header = RunHeader()
        self.nodes: dict[int, NodeView] = {}
        self.children: defaultdict[int | None, list[int]] = defaultdict(list)
        self.budget: BudgetUsed | None = None
        self.logs: deque[LogLine] = deque(maxlen=LOG_KEEP)
        self.failures = 0
        self._best_path: frozenset[int] | None = None

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> RunState:
        state = cls()
        state.header = snapshot.header.model_copy()
        state.budget = snapshot.budget
        state.logs.extend(snapshot.logs)
        for node in sorted(snapshot.nodes, key=lambda n: n.id):
            state._put(node)
        if state.header.best_node_id is None:
            state._recompute_best()
        return state

    @property
    def best_id(self) -> int | None:
        return self.header.best_node_id

    def _put(self, node: NodeView) -> bool:
        old = self.nodes.get(node.id)
        self.nodes[node.id] = node
        if old is None:
            self.children[node.parent_id].append(node.id)
        else:
            self.failures -= old.status == "failed"
        self.failures += node.status == "failed"
        return old is None

    def _recompute_best(self) -> None:
        timed = [n for n in self.nodes.values() if n.speedup is not None and n.status != "failed"]
        if timed:
            best = max(timed, key=lambda n: (n.speedup or 0.0, -n.id))
            self.header.best_node_id, self.header.best_speedup = best.id, best.speedup

    def apply(self, events: Iterable[EngineEvent]) -> Changes:
        """Fold a batch of events in; what changed, each id once."""
        changes = Changes(best_before=self.best_id)
        added: dict[int, None] = {}
        changed: dict[int, None] = {}
        for event in events:
            previous = self.nodes.get(event.node.id) if isinstance(event, NodeAdded | NodeChanged) else None
            derived = describe(event, previous.status if previous is not None else None)
            if derived is not None:
                self.logs.append(derived)
                changes.logs.append(derived)
            if isinstance(event, NodeAdded | NodeChanged):
                if self._put(event.node):
                    added[event.node.id] = None
                elif event.node.id not in added:
                    changed[event.node.id] = None
            elif isinstance(event, BestImproved):
                self.header.best_node_id, self.header.best_speedup = event.node_id, event.speedup
                changes.header = True
            elif isinstance(event, BudgetUsed):
                self.budget = event
                changes.header = True
            elif isinstance(event, StateChanged):
                self.header.state = event.state
                if event.state == "finished" and self.header.ended_at is None:
                    self.header.ended_at = event.at
                changes.header = True
            elif isinstance(event, LogLine):
                self.logs.append(event)
                changes.logs.append(event)
        changes.added, changes.changed = list(added), list(changed)
        if added or changed:
            changes.header = True
        if self.best_id != changes.best_before:
            changes.best_changed = True
            self._best_path = None
        return changes

    def best_path(self) -> frozenset[int]:
        """Ids from the best node up to its root."""
        if self._best_path is None:
            path: list[int] = []
            node_id = self.best_id
            while node_id is not None and node_id in self.nodes and node_id not in path:
                path.append(node_id)
                node_id = self.nodes[node_id].parent_id
            self._best_path = frozenset(path)
        return self._best_path

    def path_to(self, node_id: int) -> list[int]:
        """Ids from the root down to `node_id`."""
        path: list[int] = []
        current: int | None = node_id
        while current is not None and current in self.nodes and current not in path:
            path.append(current)
            current = self.nodes[current].parent_id
        return path[::-1]

    def is_improving(self, node: NodeView) -> bool:
        """Timed and faster than its parent (or than the baseline, for a root)."""
        if node.status == "failed" or node.speedup is None:
            return False
        parent = self.nodes.get(node.parent_id) if node.parent_id is not None else None
        reference = parent.speedup if parent is not None and parent.speedup is not None else 1.0
        return node.speedup > reference

    def matches(self, node: NodeView, mode: str) -> bool:
        """Whether a filter shows this node."""
        if mode == "improving":
            return self.is_improving(node)
        if mode == "failures":
            return node.status == "failed"
        return True

    def matching(self, mode: str) -> list[int]:
        """Ids a filter shows, in id order."""
        return [i for i, n in self.nodes.items() if self.matches(n, mode)]
