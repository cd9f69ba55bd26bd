"""A run as its views see it, folded from the engine's events: one reducer for the TUI and the CLI.

Why here: both faces import the engine, neither imports the other, and nothing here needs Textual or a
store, so the live view of `optimize`, the TUI and a store follower fold the same events the same way.
Events are folded in batches and each batch says what it changed, so a view redraws only that.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from kernelforge_tui.models.evaluation import speedup_text
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
from kernelforge_tui.models.nodes import NodeStatus, NodeView
from kernelforge_tui.models.runs import RunInfo

LOG_KEEP = 500
"""Log lines a view keeps (the oldest go first)."""
_LIVE_STATES: dict[str, SearchState] = {
    "starting": "starting",
    "running": "running",
    "paused": "paused",
    "stopping": "stopping",
}
"""The stored states in which a search is still going; any other ("finished", "interrupted") is over."""


class RunHeader(BaseModel):
    """What a view shows about a run as a whole, whichever source it came from."""

    run_id: str = ""
    card_name: str = ""
    gpu_name: str = ""
    backend: str = ""
    state: SearchState = "starting"
    started_at: float | None = None
    ended_at: float | None = None
    best_node_id: int | None = None
    best_speedup: float | None = None

    @classmethod
    def from_info(cls, info: RunInfo) -> RunHeader:
        """The header of a stored run; a run whose process died ("interrupted") is no longer running."""
        return cls(
            run_id=info.run_id,
            card_name=info.card_name,
            gpu_name=info.gpu_name,
            backend=info.backend,
            state=_LIVE_STATES.get(info.state, "finished"),
            started_at=info.started_at,
            ended_at=info.ended_at,
            best_node_id=info.best_node_id,
            best_speedup=info.best_speedup,
        )


class Snapshot(BaseModel):
    """Everything needed to draw a run from scratch; later changes come as events."""

    header: RunHeader = Field(default_factory=RunHeader)
    nodes: list[NodeView] = Field(default_factory=list)
    budget: BudgetUsed | None = None
    logs: list[LogLine] = Field(default_factory=list)


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


def describe(event: EngineEvent, previous_status: NodeStatus | None) -> LogLine | None:
    """The log line an event deserves beyond the engine's own log lines: what a proposer tried, each
    failure with its error (a compiler error keeps its offending line), new bests and state changes."""
    if isinstance(event, NodeAdded | NodeChanged):
        node = event.node
        if isinstance(event, NodeAdded) and node.mutation:
            parent = f" on #{node.parent_id}" if node.parent_id is not None else ""
            text = f"{node.proposer or 'proposer'} tried: {node.mutation}{parent}"
            return LogLine(at=event.at, level="debug", node_id=node.id, text=text)
        if node.status == NodeStatus.FAILED and previous_status != NodeStatus.FAILED:
            text = f"{node.failure or 'failed'}: {node.reason}".rstrip(": ")
            return LogLine(at=event.at, level="error", node_id=node.id, text=text)
        return None
    if isinstance(event, BestImproved):
        text = f"new best: {speedup_text(event.speedup, event.speedup_interval)}, {event.latency_us:.2f} us"
        if event.gain_interval is not None:
            low, high = event.gain_interval
            text += f"; {low:.3f}-{high:.3f}x the previous best's speedup"
        return LogLine(at=event.at, node_id=event.node_id, text=text)
    if isinstance(event, StateChanged):
        return LogLine(at=event.at, text=f"search {event.state}" + (f": {event.reason}" if event.reason else ""))
    return None


class RunView:
    """Nodes by id, children by parent, the best node, the budget, the search state and the log's tail.

    `apply` is the only way in after the start: it folds a batch of events and says what changed.
    """

    def __init__(self) -> None:
        self.header = RunHeader()
        self.nodes: dict[int, NodeView] = {}
        self.children: defaultdict[int | None, list[int]] = defaultdict(list)
        self.budget: BudgetUsed | None = None
        self.logs: deque[LogLine] = deque(maxlen=LOG_KEEP)
        self.failures = 0
        self._best_path: frozenset[int] | None = None

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> RunView:
        view = cls()
        view.header = snapshot.header.model_copy()
        view.budget = snapshot.budget
        view.logs.extend(snapshot.logs)
        for node in sorted(snapshot.nodes, key=lambda n: n.id):
            view._put(node)
        if view.header.best_node_id is None:
            view._recompute_best()
        return view

    @property
    def best_id(self) -> int | None:
        return self.header.best_node_id

    @property
    def root_id(self) -> int | None:
        """The first node: the card's baseline, which every speedup is measured against."""
        roots = self.children.get(None)
        return roots[0] if roots else None

    @property
    def live(self) -> bool:
        """Whether the search is still running (or paused): steering it means something."""
        return self.header.state != "finished"

    def _put(self, node: NodeView) -> bool:
        old = self.nodes.get(node.id)
        self.nodes[node.id] = node
        if old is None:
            self.children[node.parent_id].append(node.id)
        else:
            self.failures -= old.status == NodeStatus.FAILED
        self.failures += node.status == NodeStatus.FAILED
        return old is None

    def _recompute_best(self) -> None:
        timed = [n for n in self.nodes.values() if n.speedup is not None and n.status != NodeStatus.FAILED]
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
            self._best_path = frozenset(self.path_to(self.best_id)) if self.best_id is not None else frozenset()
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
        if node.status == NodeStatus.FAILED or node.speedup is None:
            return False
        parent = self.nodes.get(node.parent_id) if node.parent_id is not None else None
        reference = parent.speedup if parent is not None and parent.speedup is not None else 1.0
        return node.speedup > reference

    def recent_logs(self, count: int) -> list[LogLine]:
        """The last `count` log lines, debug lines (what each proposer tried) left out."""
        found: list[LogLine] = []
        for line in reversed(self.logs):
            if line.level != "debug":
                found.append(line)
                if len(found) == count:
                    break
        return found[::-1]
