"""Nodes of the search tree as every layer sees them: status, failure kind, the view, the full record, an outcome."""

from __future__ import annotations

import time
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.vocabulary.identity import Identity
from kernelforge_tui.vocabulary.identity import ParamValue as ParamValue  # its old home: importers keep it
from kernelforge_tui.vocabulary.rewards import Reward


class NodeStatus(StrEnum):
    """A node moves proposed -> built -> verified -> timed (-> profiled), or ends as failed (with a kind)."""

    PROPOSED = "proposed"
    BUILT = "built"
    VERIFIED = "verified"
    TIMED = "timed"
    PROFILED = "profiled"
    FAILED = "failed"


IN_FLIGHT: frozenset[NodeStatus] = frozenset({NodeStatus.PROPOSED, NodeStatus.BUILT})
"""Proposed or built but not yet measured: such nodes are neither selected nor counted as visits."""
MEASURED: frozenset[NodeStatus] = frozenset({NodeStatus.VERIFIED, NodeStatus.TIMED, NodeStatus.PROFILED})
"""Proven correct (and usually timed): only these nodes can be parents of new candidates."""


class FailureKind(StrEnum):
    """Why a candidate did not count: the kinds the search and the views show."""

    COMPILE = "compile"
    LAUNCH = "launch"
    MISMATCH = "mismatch"
    TIMEOUT = "timeout"
    CHEAT = "cheat"
    WORKER = "worker"
    MALFORMED = "malformed"
    """The model's reply held no kernel that could be read (no code block, a plan that does not fit the card), even
    after one request to fix it: the reply is kept as the source, and it goes back to the coder, not the debugger."""


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
    speedup_interval: tuple[float, float] | None = None
    """95% interval of the speedup (bootstrap over the interleaved samples)."""
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
    """The node's reward in the tree search (every term: `NodeRecord.reward`); None before it was measured."""
    reward_note: str = ""
    """The reward's one-line explanation in words."""


class NodeRecord(BaseModel):
    """A node in full, as stored (the search restores its tree from these)."""

    id: int
    parent_id: int | None
    status: NodeStatus
    failure: FailureKind | None
    reason: str
    mutation: str
    proposer: str
    params: dict[str, ParamValue]
    source: str
    plan: LaunchPlan
    latency_us: float | None
    speedup: float | None
    ceiling_share: float | None
    banned: bool
    pinned: bool
    export: bool
    hints: list[str]
    attempts: int
    last_measurement: int | None
    """Id of the node's latest measurement: the order the search replays outcomes in."""
    reward: Reward | None = None
    """Every term of the node's reward; None before it was measured, or in a run of schema 1."""
    repair_of: int | None = None
    """The failed node this one repairs (an LLM debugger's fix), if it is a repair."""
    judge_score: float | None = None
    """The LLM judge's score of the edit, 0..1 (a term of the reward), if a judge scored it."""
    identity: Identity | None = None
    """What makes the node's candidate itself (vocabulary/identity.py); None in a run stored before schema 6."""


class NodeStats(Frozen):
    """A node's tree statistics as stored: what selection has learned about its subtree."""

    visits: int
    """Measured or failed nodes in the subtree, the node itself included."""
    value: float
    """Their mean reward."""


class NodeOutcome(BaseModel):
    """What one evaluation decided about a node: written with its measurement in one transaction."""

    status: NodeStatus
    failure: FailureKind | None = None
    reason: str = ""
    latency_us: float | None = None
    speedup: float | None = None
    speedup_interval: tuple[float, float] | None = None
    ceiling_share: float | None = None
    reward: Reward | None = None
    best: bool = False
    """The node becomes the run's best: faster than the best so far beyond the noise (`engine.promotion`)."""
