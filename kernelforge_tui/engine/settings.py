"""How a run searches: what it records in its store (a resume reads it back) and how much it keeps in flight."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.strategies import DEFAULT_STRATEGY, STRATEGIES
from kernelforge_tui.engine.tree import TreeSettings


class PipelineSettings(BaseModel):
    """How much work the search keeps in flight."""

    model_config = ConfigDict(extra="forbid")

    max_in_flight: int | None = Field(default=None, ge=1)
    """Candidates proposed but not yet measured; default build_parallel + 2 per GPU lane."""
    build_parallel: int = Field(default=4, ge=1)
    """Builds running at once (nvcc processes; the Builder caps them as well)."""
    max_expanding: int = Field(default=1, ge=1)
    """Expansions in progress at once: 1 for the template proposer (instant); an LLM team writes for seconds, so
    several run side by side (`[llm.agents] expansions`) and the GPU is not left waiting on one reply."""
    poll_s: float = Field(default=0.25, gt=0)
    """How often the store is polled for commands written by another process (the TUI)."""
    stats_every_s: float = Field(default=1.0, gt=0)
    """How often a BudgetUsed event is emitted and the wall-time budget checked."""


class RunSettings(BaseModel):
    """What a run records about how it searches (the store's settings); a resume reads it back."""

    strategy: str = DEFAULT_STRATEGY
    """The selection strategy (`engine/strategies/`); runs recorded before strategies existed are MCTS."""
    tree: TreeSettings = Field(default_factory=TreeSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    budget: Budget = Field(default_factory=Budget)
    proposer: str = ""
    app: dict[str, Any] = Field(default_factory=dict)
    """The kernelforge Settings the run started with, for the record."""

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, name: str) -> str:
        if name not in STRATEGIES:
            raise ValueError(f"no selection strategy {name!r}: use one of {', '.join(sorted(STRATEGIES))}")
        return name
