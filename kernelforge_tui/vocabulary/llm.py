"""LLM calls as every layer sees them: one recorded call, a run's totals, and how each model fared on a card.

Why integer nano-dollars: a cost is tokens times a price per million tokens; with prices of at most three decimals
that is a whole number of nano-dollars, so the costs of a run's calls add up exactly to its total.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from kernelforge_tui.vocabulary.nodes import Frozen

Role = Literal["analyst", "planner", "coder", "debugger", "judge"]
CallOutcome = Literal["ok", "error", "malformed", "refused", "cancelled"]
"""ok: a usable reply; error: the provider failed (the error says how); malformed: a reply the role could not use
(no code block, a plan that fails validation, a judge score that is not one) after its repair request; refused: the
model or the provider's content filter refused the request (finish reason refusal or content_filter); cancelled:
the search paused or stopped while it was being written."""

NANO = 1_000_000_000


def usd(nanousd: int) -> float:
    return nanousd / NANO


class LlmCall(Frozen):
    """One chat call of one role. `prompt` and `reply` are None when the user keeps only their hashes."""

    id: int | None = None
    node_id: int | None = None
    """The node the call worked on: the parent being expanded, or the failed node being repaired."""
    child_id: int | None = None
    """The candidate the call helped write, once it is in the tree."""
    role: Role
    provider: str
    model: str
    """The model's id at the provider."""
    prompt: str | None = None
    """The messages as JSON."""
    prompt_sha256: str
    reply: str | None = None
    reply_sha256: str
    input_tokens: int = Field(default=0, ge=0)
    """Every prompt token, over every attempt, the cached ones included."""
    output_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    """Of the input tokens, those written to the provider's prompt cache (priced apart)."""
    cache_read_tokens: int = Field(default=0, ge=0)
    """Of the input tokens, those read from the prompt cache (priced apart)."""
    estimated: bool = False
    """Some of the tokens (and so the cost) are an estimate: an attempt the provider billed but did not report, such
    as a stream that broke or was cancelled before its usage (`llm.pricing.estimated_usage`)."""
    cost_nanousd: int = Field(default=0, ge=0)
    latency_s: float = 0.0
    first_token_s: float | None = None
    attempts: int = 1
    outcome: CallOutcome = "ok"
    error: str = ""
    at: float = Field(default_factory=time.time)

    @property
    def cost_usd(self) -> float:
        return usd(self.cost_nanousd)


class LlmTotals(Frozen):
    """What a run's calls used so far."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanousd: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost_usd(self) -> float:
        return usd(self.cost_nanousd)

    def plus(self, call: LlmCall) -> LlmTotals:
        return LlmTotals(
            calls=self.calls + 1,
            input_tokens=self.input_tokens + call.input_tokens,
            output_tokens=self.output_tokens + call.output_tokens,
            cost_nanousd=self.cost_nanousd + call.cost_nanousd,
        )


class ModelRecord(Frozen):
    """How one model fared as a kernel writer (coder or debugger) on one run: what a router and a comparison read."""

    provider: str
    model: str
    family: str
    card: str
    calls: int
    kernels: int
    """Candidates it wrote that reached the tree."""
    correct: int
    """Of those, the ones proven correct."""
    best_speedup: float | None
    cost_nanousd: int
    """What all its calls cost, every role's."""
    writing_cost_nanousd: int
    """What its coder and debugger calls cost: the kernels' share, which the cost per kernel divides."""

    @property
    def success_rate(self) -> float | None:
        return self.correct / self.kernels if self.kernels else None
