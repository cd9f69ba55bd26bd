"""Typed events the engine emits: the only way a search tells its views what happened.

The TUI and the CLI are two views of the same engine; neither reaches into it. Every event is also
written to the run's store, so a second process (the TUI following a live run) sees the same.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import Field

from kernelforge_tui.vocabulary.llm import LlmCall, LlmTotals, Role
from kernelforge_tui.vocabulary.nodes import Frozen, NodeView

SearchState = Literal["starting", "running", "paused", "stopping", "finished"]

LogLevel = Literal["debug", "info", "warning", "error"]


class Event(Frozen):
    at: float = Field(default_factory=time.time)


class NodeAdded(Event):
    kind: Literal["node_added"] = "node_added"
    node: NodeView


class NodeChanged(Event):
    """Status, measurements or flags of a node changed: the whole view, so a view can just replace it."""

    kind: Literal["node_changed"] = "node_changed"
    node: NodeView


class BestImproved(Event):
    kind: Literal["best_improved"] = "best_improved"
    node_id: int
    speedup: float
    latency_us: float
    ceiling_share: float | None = None
    speedup_interval: tuple[float, float] | None = None
    """95% interval of the new best's speedup over the baseline."""
    gain_interval: tuple[float, float] | None = None
    """95% interval of its speedup over the previous best's: promoted because all of it is above 1."""


class BudgetUsed(Event):
    """Where the search stands against each budget (None: no cap)."""

    kind: Literal["budget"] = "budget"
    iterations: int
    max_iterations: int | None = None
    elapsed_s: float
    max_seconds: float | None = None
    gpu_seconds: float
    max_gpu_seconds: float | None = None
    candidates_per_minute: float = 0.0
    gpu_busy_share: float = 0.0
    tokens: int = 0
    """LLM tokens in and out, the run's total."""
    max_tokens: int | None = None
    money_usd: float = 0.0
    """LLM spend in US dollars, the run's total."""
    max_money_usd: float | None = None


class LogLine(Event):
    kind: Literal["log"] = "log"
    level: LogLevel = "info"
    text: str
    node_id: int | None = None


class StateChanged(Event):
    kind: Literal["state"] = "state"
    state: SearchState
    reason: str = ""


class LlmCallStarted(Event):
    """A role's call went out; `call_key` ties its text and its end to it."""

    kind: Literal["llm_started"] = "llm_started"
    call_key: str
    role: Role
    provider: str
    model: str
    node_id: int | None = None


class LlmText(Event):
    """A piece of a reply as it is written. Only in-process views get these: they are not stored (a view
    following from another process sees the whole reply when the call ends)."""

    kind: Literal["llm_text"] = "llm_text"
    call_key: str
    text: str
    retry: bool = False
    """The attempt failed and a new one starts: drop the text so far."""


class LlmCallEnded(Event):
    """A call ended and is recorded (`call.id`); `totals` is the run's use so far."""

    kind: Literal["llm_ended"] = "llm_ended"
    call_key: str
    call: LlmCall
    totals: LlmTotals


EPHEMERAL_KINDS = frozenset({"llm_text"})
"""Events the bus hands to in-process views only, never to the store."""

EngineEvent = Annotated[
    NodeAdded
    | NodeChanged
    | BestImproved
    | BudgetUsed
    | LogLine
    | StateChanged
    | LlmCallStarted
    | LlmText
    | LlmCallEnded,
    Field(discriminator="kind"),
]
