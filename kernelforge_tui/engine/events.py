"""Typed events the engine emits and typed commands it accepts: the only way views talk to a search.

The TUI and the CLI are two views of the same engine; neither reaches into it. Every event and command
is also written to the run's store, so a second process (the TUI following a live run) sees the same.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.gpu.protocol import FailureKind

NodeStatus = Literal["proposed", "built", "verified", "timed", "profiled", "failed"]
"""A node moves proposed -> built -> verified -> timed (-> profiled), or ends as failed (with a kind)."""

SearchState = Literal["starting", "running", "paused", "stopping", "finished"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeView(Frozen):
    """What a view needs to draw one node (the source is fetched on demand from the store)."""

    id: int
    parent_id: int | None
    status: NodeStatus
    failure: FailureKind | None = None
    reason: str = ""
    mutation: str = ""
    """What the proposer says it changed, in words (e.g. "vector width 4 -> 8")."""
    proposer: str = ""
    latency_us: float | None = None
    speedup: float | None = None
    """Baseline time over this node's time, measured side by side (the baseline is the card's)."""
    ceiling_share: float | None = None
    visits: int = 0
    value: float = 0.0
    banned: bool = False
    pinned: bool = False
    export: bool = False
    created_at: float = Field(default_factory=time.time)
    profiled: bool = False
    """An ncu profile is saved on the node (`RunStore.profile`)."""
    reward_total: float | None = None
    """The node's reward in the tree search (every term: `RunStore.reward`); None before it was measured."""
    reward_note: str = ""
    """The reward's one-line explanation in words."""


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


class LogLine(Event):
    kind: Literal["log"] = "log"
    level: Literal["debug", "info", "warning", "error"] = "info"
    text: str
    node_id: int | None = None


class StateChanged(Event):
    kind: Literal["state"] = "state"
    state: SearchState
    reason: str = ""


EngineEvent = Annotated[
    NodeAdded | NodeChanged | BestImproved | BudgetUsed | LogLine | StateChanged, Field(discriminator="kind")
]


class Command(Frozen):
    at: float = Field(default_factory=time.time)


class Pause(Command):
    kind: Literal["pause"] = "pause"


class Resume(Command):
    kind: Literal["resume"] = "resume"


class Stop(Command):
    kind: Literal["stop"] = "stop"


class ExpandNode(Command):
    """Propose children of this node next, ahead of what selection would pick."""

    kind: Literal["expand"] = "expand"
    node_id: int


class AddHint(Command):
    """Free text handed to the proposer for this node's next children."""

    kind: Literal["hint"] = "hint"
    node_id: int
    text: str


class InjectKernel(Command):
    """A hand-written kernel, evaluated as a child of this node like any proposal."""

    kind: Literal["inject"] = "inject"
    parent_id: int
    source: str
    plan: LaunchPlan
    note: str = "hand-written"


class BanSubtree(Command):
    """Never select in this subtree again (until unbanned)."""

    kind: Literal["ban"] = "ban"
    node_id: int
    banned: bool = True


class PinSubtree(Command):
    """Select only in this subtree while pinned."""

    kind: Literal["pin"] = "pin"
    node_id: int
    pinned: bool = True


class ProfileNode(Command):
    """Profile this node with Nsight Compute now (queued ahead of the automatic profiles)."""

    kind: Literal["profile"] = "profile"
    node_id: int


class MarkExport(Command):
    kind: Literal["export"] = "export"
    node_id: int
    export: bool = True


EngineCommand = Annotated[
    Pause | Resume | Stop | ExpandNode | AddHint | InjectKernel | BanSubtree | PinSubtree | MarkExport | ProfileNode,
    Field(discriminator="kind"),
]
