"""A run as its views see it, folded from the engine's events: one reducer for the TUI and the CLI.

Why here: both faces import the engine, neither imports the other, and nothing here needs Textual or a
store, so the live view of `optimize`, the TUI and a store follower fold the same events the same way.
Events are folded in batches and each batch says what it changed, so a view redraws only that.

LLM calls fold the same way: the run's totals, each call in flight with the text streamed so far (held as the
pieces that arrived, so a view appends what is new instead of redrawing the whole reply), and the calls that ended.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from kernelforge_tui.engine.feedback import NOTHING_TO_PROPOSE
from kernelforge_tui.vocabulary.evaluation import speedup_text
from kernelforge_tui.vocabulary.events import (
    BestImproved,
    BudgetUsed,
    EngineEvent,
    LlmCallEnded,
    LlmCallStarted,
    LlmText,
    LogLevel,
    LogLine,
    NodeAdded,
    NodeChanged,
    SearchState,
    StateChanged,
)
from kernelforge_tui.vocabulary.llm import CallOutcome, LlmCall, LlmTotals, Role
from kernelforge_tui.vocabulary.nodes import NodeStatus, NodeView
from kernelforge_tui.vocabulary.runs import RunInfo

LOG_KEEP = 500
"""Log lines a view keeps (the oldest go first)."""
CALLS_KEEP = 100
"""Ended LLM calls a view keeps (the oldest go first; every call stays in the store)."""
WRITERS: frozenset[Role] = frozenset({"coder", "debugger"})
"""The roles whose reply is a kernel: the ones a view streams into its diff."""
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
    reason: str = ""
    """Why the run is in its state (why it stopped, once it has)."""

    @property
    def nothing_to_propose(self) -> bool:
        """The run stopped because its proposer has nothing for the card (no template serves its family)."""
        return self.reason.startswith(NOTHING_TO_PROPOSE)

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
            reason=info.reason,
        )


class Snapshot(BaseModel):
    """Everything needed to draw a run from scratch; later changes come as events."""

    header: RunHeader = Field(default_factory=RunHeader)
    nodes: list[NodeView] = Field(default_factory=list)
    budget: BudgetUsed | None = None
    logs: list[LogLine] = Field(default_factory=list)
    llm_totals: LlmTotals = Field(default_factory=LlmTotals)
    calls_in_flight: list[LlmCallStarted] = Field(default_factory=list)
    """LLM calls started and not yet ended (their text so far is not stored: it comes with their end)."""
    ended_calls: list[LlmCall] = Field(default_factory=list)
    """The latest ended calls, oldest first (at most CALLS_KEEP)."""


@dataclass
class LiveCall:
    """An LLM call in flight: who asks what for which node, and its reply so far as the pieces that arrived."""

    key: str
    role: Role
    provider: str
    model: str
    node_id: int | None
    started_at: float
    pieces: list[str] = field(default_factory=list)
    """The reply so far, as it arrived: a view that showed `n` pieces appends `pieces[n:]`."""
    attempt: int = 1
    """Which attempt the pieces belong to: a retry drops them and counts up (a view starts its text over)."""
    chars: int = 0

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def writes_kernel(self) -> bool:
        return self.role in WRITERS

    @classmethod
    def started(cls, event: LlmCallStarted) -> LiveCall:
        return cls(event.call_key, event.role, event.provider, event.model, event.node_id, event.at)

    def as_event(self) -> LlmCallStarted:
        return LlmCallStarted(
            at=self.started_at,
            call_key=self.key,
            role=self.role,
            provider=self.provider,
            model=self.model,
            node_id=self.node_id,
        )


@dataclass(frozen=True)
class Spend:
    """What a run's LLM calls used against its caps: the header's cost and token meters."""

    calls: int = 0
    tokens: int = 0
    max_tokens: int | None = None
    money_usd: float = 0.0
    max_money_usd: float | None = None

    @property
    def shown(self) -> bool:
        """Worth a meter: the run made calls, or caps them."""
        return bool(self.calls or self.tokens or self.money_usd) or (
            self.max_tokens is not None or self.max_money_usd is not None
        )

    def money_text(self) -> str:
        spent = money_text(self.money_usd)
        return spent + (f"/{money_text(self.max_money_usd)}" if self.max_money_usd is not None else "")

    def tokens_text(self) -> str:
        used = count_text(self.tokens)
        return used + (f"/{count_text(self.max_tokens)}" if self.max_tokens is not None else "") + " tok"


def money_text(usd: float) -> str:
    """Dollars as a meter shows them: cents from ten cents on, four decimals below (one call costs fractions)."""
    return f"${usd:,.2f}" if usd >= 0.1 or usd == 0 else f"${usd:.4f}"


def count_text(n: int) -> str:
    """1234 -> 1.2k, 2500000 -> 2.5M."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k".replace(".0k", "k")
    return f"{n / 1_000_000:.2f}M"


def token_notes(call: LlmCall) -> str:
    """What a call's token counts hide: its cached input tokens, and whether the counts are an estimate."""
    cached = call.cache_write_tokens + call.cache_read_tokens
    return (f" ({cached:,} cached)" if cached else "") + (" (estimated)" if call.estimated else "")


def call_summary(call: LlmCall) -> str:
    """A call in one line: role, model, tokens, cost, latency, outcome (and its error's first line)."""
    text = (
        f"{call.role} {call.provider}/{call.model}: {call.input_tokens:,} in + {call.output_tokens:,} out tokens"
        f"{token_notes(call)}, {money_text(call.cost_usd)}, {call.latency_s:.1f} s"
    )
    if call.attempts > 1:
        text += f", {call.attempts} attempts"
    text += f", {call.outcome}"
    if call.error.strip():
        text += ": " + call.error.strip().split("\n", 1)[0]
    return text


CALL_LOG_LEVEL: dict[CallOutcome, LogLevel] = {
    "ok": "info",
    "cancelled": "info",
    "error": "warning",
    "malformed": "warning",
    "refused": "warning",
}


@dataclass
class Changes:
    """What one batch of events changed."""

    added: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    best_before: int | None = None
    best_changed: bool = False
    logs: list[LogLine] = field(default_factory=list)
    header: bool = False
    calls: list[str] = field(default_factory=list)
    """Keys of the LLM calls that started, streamed text or ended in the batch, each once."""
    ended_calls: list[LlmCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.best_changed or self.logs or self.header or self.calls)


def describe(event: EngineEvent, previous_status: NodeStatus | None) -> LogLine | None:
    """The log line an event deserves beyond the engine's own log lines: what a proposer tried, each
    failure with its error (a compiler error keeps its offending line), new bests, state changes, and each
    ended LLM call (a failed or malformed one at warning level)."""
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
    if isinstance(event, LlmCallEnded):
        call = event.call
        node_id = call.child_id if call.child_id is not None else call.node_id
        return LogLine(at=event.at, level=CALL_LOG_LEVEL[call.outcome], node_id=node_id, text=call_summary(call))
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
        self.llm_totals = LlmTotals()
        """The run's LLM use so far (from each ended call's event)."""
        self.calls: dict[str, LiveCall] = {}
        """LLM calls in flight by call key, oldest first."""
        self.ended_calls: deque[LlmCall] = deque(maxlen=CALLS_KEEP)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> RunView:
        view = cls()
        view.header = snapshot.header.model_copy()
        view.budget = snapshot.budget
        view.logs.extend(snapshot.logs)
        view.llm_totals = snapshot.llm_totals
        view.calls = {e.call_key: LiveCall.started(e) for e in snapshot.calls_in_flight}
        view.ended_calls.extend(snapshot.ended_calls)
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
        calls: dict[str, None] = {}
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
                self.header.state, self.header.reason = event.state, event.reason
                if event.state == "finished":
                    if self.header.ended_at is None:
                        self.header.ended_at = event.at
                    calls.update(dict.fromkeys(self.calls))  # a call in flight when its process died never ends
                    self.calls.clear()
                changes.header = True
            elif isinstance(event, LogLine):
                self.logs.append(event)
                changes.logs.append(event)
            elif isinstance(event, LlmCallStarted | LlmText | LlmCallEnded):
                self._apply_call(event, calls, changes)
        changes.added, changes.changed, changes.calls = list(added), list(changed), list(calls)
        if added or changed:
            changes.header = True
        if self.best_id != changes.best_before:
            changes.best_changed = True
            self._best_path = None
        return changes

    def _apply_call(
        self, event: LlmCallStarted | LlmText | LlmCallEnded, calls: dict[str, None], changes: Changes
    ) -> None:
        if isinstance(event, LlmCallStarted):
            self.calls[event.call_key] = LiveCall.started(event)
        elif isinstance(event, LlmText):
            live = self.calls.get(event.call_key)
            if live is None:
                return  # its start came before this view (or its end already did): nothing to add to
            if event.retry:
                live.pieces.clear()
                live.chars = 0
                live.attempt += 1
            if event.text:
                live.pieces.append(event.text)
                live.chars += len(event.text)
        else:
            self.calls.pop(event.call_key, None)
            self.ended_calls.append(event.call)
            changes.ended_calls.append(event.call)
            self.llm_totals = event.totals
            changes.header = True
        calls[event.call_key] = None

    def spend(self) -> Spend:
        """The run's LLM use against its caps. The ended calls' totals and the budget's are both running totals
        of the same run, so the larger is the later."""
        budget, totals = self.budget, self.llm_totals
        return Spend(
            calls=totals.calls,
            tokens=max(totals.tokens, budget.tokens if budget else 0),
            max_tokens=budget.max_tokens if budget else None,
            money_usd=max(totals.cost_usd, budget.money_usd if budget else 0.0),
            max_money_usd=budget.max_money_usd if budget else None,
        )

    def writing_call(self, node_id: int | None = None) -> LiveCall | None:
        """The latest call in flight that writes a kernel (a coder's or a debugger's): for `node_id`, or for any
        node when it is None."""
        for live in reversed(self.calls.values()):
            if live.writes_kernel and (node_id is None or live.node_id == node_id):
                return live
        return None

    def calls_for(self, node_id: int) -> list[LiveCall]:
        """The calls in flight that work on `node_id`, oldest first."""
        return [live for live in self.calls.values() if live.node_id == node_id]

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
