"""The proposer interface: what the search hands a proposer, and what it gets back.

Why a Protocol: the search must not care whether candidates come from the template library or from an
LLM team; both see the same context (the parent, its failed siblings, hints from the person steering)
and answer with the same `Proposal` (device source plus a LaunchPlan: data, never host code).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.vocabulary.evaluation import Ceilings, Diagnostic, PtxasStats
from kernelforge_tui.vocabulary.identity import SourceIdentity, TemplateIdentity, candidate_key, source_identity
from kernelforge_tui.vocabulary.nodes import FailureKind, ParamValue
from kernelforge_tui.vocabulary.profiles import NodeProfile


class Proposal(BaseModel):
    """One candidate kernel a proposer offers as a child of a node."""

    model_config = ConfigDict(extra="forbid")

    source: str
    """Device-only CUDA source; it is checked and built with `nvcc -cubin`, never run on the host."""
    plan: LaunchPlan
    mutation: str
    """What changed against the parent, in words the TUI shows (e.g. "vector width 4 -> 8")."""
    proposer: str
    """The proposer's name (e.g. "templates", "hand", an agent's name)."""
    params: dict[str, ParamValue] = Field(default_factory=dict)
    """Template parameters of this candidate; {} for LLM-written or hand-written kernels."""
    identity: TemplateIdentity | None = None
    """The candidate's identity when a template made it (its name, version and canonical params); None: the
    candidate is its source and plan (vocabulary/identity.py)."""
    repair_of: int | None = None
    """The failed node (a child of the same parent) this candidate repairs: the debugger's rounds are counted along
    these links."""
    judge_score: float | None = None
    """The LLM judge's score of the edit (0..1), a term of the reward."""
    llm_calls: list[int] = Field(default_factory=list)
    """Ids of the recorded LLM calls that wrote it: linked to the node it becomes."""
    rejected: str | None = None
    """Why the model's reply could not be used: the engine records the node as failed at once, the reply kept as its
    source."""
    notes: list[str] = Field(default_factory=list)
    """What the operator should know about how it was written (a reply cut off at max_tokens and asked for again):
    the search logs each line."""

    def candidate(self) -> TemplateIdentity | SourceIdentity:
        """Its identity: the template's, or its normalised source and plan."""
        return self.identity if self.identity is not None else source_identity(self.source, self.plan)


class ParentInfo(BaseModel):
    """The node being expanded: the proposer mutates this one."""

    id: int
    source: str
    plan: LaunchPlan
    params: dict[str, ParamValue] = Field(default_factory=dict)
    latency_us: float | None = None
    speedup: float | None = None
    """Baseline time over the parent's time (the root, the card's baseline, is about 1.0)."""
    ceiling_share: float | None = None
    """The parent's share of the measured ceiling (as the metrics pane shows it)."""
    profile: NodeProfile | None = None
    """The parent's Nsight Compute profile when it was profiled: its metrics, its bottleneck class and the
    metrics that matter for it (`profile.hardware.lines()` reads as text), its ptxas stats."""
    ptxas: PtxasStats | None = None
    """The parent's resource use as ptxas reported it when it was built (registers, shared memory, spills)."""


class LineageStep(BaseModel):
    """One ancestor of the node being expanded, root first: what was changed and what it measured."""

    id: int
    mutation: str
    speedup: float | None = None


class FailedSibling(BaseModel):
    """A child of the same parent that failed: so the proposer does not offer it again."""

    node_id: int
    summary: str
    """The mutation text, so the proposer (or an LLM) can read what was tried."""
    params: dict[str, ParamValue] = Field(default_factory=dict)
    failure: FailureKind
    reason: str = ""
    source: str = ""
    plan: LaunchPlan | None = None
    proposer: str = ""
    repair_round: int = 0
    """How many repairs (or rewrites of unusable replies) led to this node (0: not a repair)."""
    repair_of: int | None = None
    """The sibling this one repairs or rewrites, if it is a repair."""
    repaired: bool = False
    """A repair of it is already in the tree (or on its way): the debugger does not repair it again."""
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    """Its build's compiler and source-check messages, placed in its source (bounded as the build stored them)."""


class TargetGpu(BaseModel):
    """The GPU the candidates are measured on, as the agents' prompts describe it: what the GPU worker measured, or
    that nothing was (a simulated run invents its timings)."""

    name: str
    """The backend's GPU name ("NVIDIA H200 x2", "simulated (no GPU)")."""
    ceilings: Ceilings | None = None
    """As the worker measured them; None before any GPU measured (a cluster's first evaluation) or when simulated."""
    simulated: bool = False


class ProposalContext(BaseModel):
    """Everything a proposer may use to propose children of one node."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    card: OperatorCard
    card_dir: Path
    parent: ParentInfo
    failed_siblings: list[FailedSibling] = Field(default_factory=list)
    tried_children_params: list[dict[str, ParamValue]] = Field(default_factory=list)
    """Params of every existing child of the parent (in flight, timed or failed): do not repeat them."""
    tried_candidates: set[str] = Field(default_factory=set)
    """The `candidate_key`s of the candidates already in the run (any node): the search drops duplicates anyway."""
    hints: list[str] = Field(default_factory=list)
    """Free text from the person steering, for this node and its ancestors (nearest first)."""
    best_speedup: float | None = None
    """The best speedup in the run so far."""
    lineage: list[LineageStep] = Field(default_factory=list)
    """The parent's ancestors, root first, the parent last."""
    first_expansion: bool = False
    """The parent is the root and has no children yet: a pooled proposer asks several models for a first kernel."""
    gpu: TargetGpu | None = None
    """The GPU the candidates are measured on; None: not said (a proposer called outside a search)."""

    def tried_candidate(self, proposal: Proposal) -> bool:
        """Whether the proposal is a candidate the run already holds (same identity on the card)."""
        return candidate_key(proposal.candidate(), self.card) in self.tried_candidates


@runtime_checkable
class Proposer(Protocol):
    """A source of candidate kernels. `seeds` gives the root's first children; `propose` mutates a node."""

    name: str

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        """Up to `n` new children of `ctx.parent` (fewer, or none, when the neighbourhood is exhausted)."""
        ...

    def seeds(self, card: Card) -> list[Proposal]:
        """The initial children of the root (the card's baseline kernel)."""
        ...


class SpaceCoverage(BaseModel):
    """How much of a proposer's finite space of configurations a run has tried: the run's reason says it when the
    tree runs out, so a person knows whether the space itself is spent or only the branches the search kept."""

    space: str
    """The space in words, e.g. "the templates' space for this card"."""
    tried: int
    valid: int
    counted_all: bool = True
    """False when the space was too large to count whole: `valid` is then a lower bound."""

    def reason(self, nothing_left: str) -> str:
        """The run's reason when no node is left to expand (`nothing_left` says so in general)."""
        counts = f"{self.tried} configurations tried of {'' if self.counted_all else 'at least '}{self.valid} valid"
        if self.counted_all and self.tried >= self.valid:
            return f"{self.space} is exhausted: {counts}"
        return f"{nothing_left} ({self.space}: {counts})"


@runtime_checkable
class SpaceCounter(Protocol):
    """A proposer whose candidates come from a finite space it can count (optional: the search asks it, if it is
    one, when no node is left to expand)."""

    name: str

    def coverage(self, card: OperatorCard, tried: Sequence[dict[str, ParamValue]]) -> SpaceCoverage | None:
        """How many of the card's valid configurations the `tried` params (every node's, any proposer's) cover, or
        None when the proposer has no space for the card."""
        ...
