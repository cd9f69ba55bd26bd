"""Budgets: the caps a search stops at, cleanly, and where it stands against them.

Why totals per run: a run resumed after a crash continues against the same caps (the counts are
rebuilt from the store), so `--budget-iters 200` means 200 candidates in the run, not per session.

Why paused time is not counted: a person who pauses a search to read a kernel has not spent its time
budget; the clock (`Meter.pause`) stops with the search. When a clock cap (minutes, GPU seconds) is reached,
the work not yet on a GPU is withdrawn rather than finished, so a run overruns its cap only by the
evaluations running at that moment.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.vocabulary.events import BudgetUsed
from kernelforge_tui.vocabulary.llm import LlmTotals, usd


class Budget(BaseModel):
    """What a run may spend; None means no cap. The search stops at the first cap it reaches."""

    model_config = ConfigDict(extra="forbid")

    max_iterations: int | None = Field(default=None, ge=0)
    """Candidates evaluated (measured or failed), the root (the baseline) not counted."""
    max_minutes: float | None = Field(default=None, ge=0)
    """Wall time the search runs, summed over sessions of the run; time spent paused is not counted."""
    max_gpu_seconds: float | None = Field(default=None, ge=0)
    """GPU time the workers report for proving and timing candidates."""
    max_money: float | None = Field(default=None, ge=0)
    """LLM spend in US dollars (for the LLM proposers; the template proposer spends nothing)."""
    max_tokens: int | None = Field(default=None, ge=0)
    """LLM tokens, in and out, over every call of the run."""

    def merged(self, override: Budget) -> Budget:
        """This budget with every cap `override` sets replaced (a resumed run given new caps)."""
        return self.model_copy(update=override.model_dump(exclude_none=True))


CAP_OPTIONS = {
    "max_iterations": "--budget-iters",
    "max_minutes": "--budget-minutes",
    "max_gpu_seconds": "--budget-gpu-seconds",
    "max_money": "--budget-money",
    "max_tokens": "--budget-tokens",
}
"""The command-line option that sets each cap (for messages that say how to raise one)."""


class BudgetUsage(BaseModel):
    """Where a run stands: counted from the store on resume, advanced by the search."""

    iterations: int = 0
    elapsed_s: float = 0.0
    gpu_seconds: float = 0.0
    money_nanousd: int = 0
    """LLM spend (integer nano-dollars: `vocabulary.llm`), restored from the recorded calls on a resume."""
    tokens: int = 0
    """LLM tokens in and out."""

    @property
    def money(self) -> float:
        return usd(self.money_nanousd)

    def exhausted(self, budget: Budget) -> str | None:
        """The reason to stop (which cap was reached), or None."""
        reached = self.reached(budget)
        return reached[1] if reached is not None else None

    def reached(self, budget: Budget) -> tuple[str, str] | None:
        """The first cap reached, as (its Budget field, the reason in words), or None."""
        if budget.max_iterations is not None and self.iterations >= budget.max_iterations:
            return "max_iterations", f"iteration budget reached ({self.iterations} of {budget.max_iterations})"
        if budget.max_minutes is not None and self.elapsed_s >= budget.max_minutes * 60:
            return "max_minutes", f"time budget reached ({self.elapsed_s / 60:.1f} of {budget.max_minutes:g} min)"
        if budget.max_gpu_seconds is not None and self.gpu_seconds >= budget.max_gpu_seconds:
            gpu = f"{self.gpu_seconds:.1f} of {budget.max_gpu_seconds:g} GPU s"
            return "max_gpu_seconds", f"GPU budget reached ({gpu})"
        if budget.max_money is not None and self.money >= budget.max_money:
            return "max_money", f"money budget reached (${self.money:.4f} of ${budget.max_money:g})"
        if budget.max_tokens is not None and self.tokens >= budget.max_tokens:
            return "max_tokens", f"token budget reached ({self.tokens} of {budget.max_tokens} LLM tokens)"
        return None

    def may_propose(self, budget: Budget, in_flight: int) -> bool:
        """Whether another candidate fits the iteration cap, counting those already in flight."""
        if budget.max_iterations is None:
            return True
        return self.iterations + in_flight < budget.max_iterations

    def clock_reached(self, budget: Budget) -> bool:
        """A cap that more work only overruns is reached (minutes or GPU seconds): the work not yet on a GPU is
        withdrawn. (The iteration cap already counts the candidates in flight; an LLM cap stops the calls.)"""
        minutes = budget.max_minutes is not None and self.elapsed_s >= budget.max_minutes * 60
        gpu = budget.max_gpu_seconds is not None and self.gpu_seconds >= budget.max_gpu_seconds
        return minutes or gpu


class Meter:
    """A search's accounting: the run's totals against its budget (restored on a resume) and this session's
    rates (candidates per minute, the share of time the GPU lanes were busy), with the clock stopped while
    the search is paused."""

    def __init__(self, budget: Budget, usage: BudgetUsage, lanes: int = 1) -> None:
        self.budget = budget
        self.usage = usage
        self.lanes = lanes
        """GPU lanes now (a cluster's change): the busy share is of this many GPUs over the session."""
        self._accounted = time.monotonic()
        self._session_candidates = 0
        self._session_gpu_s = 0.0
        self._session_active_s = 0.0
        self.paused = False
        """The clock is stopped: wall time passing now is not counted against the time budget."""

    def start_session(self) -> None:
        self._accounted = time.monotonic()
        self._session_active_s = 0.0

    def _unaccounted(self, now: float) -> float:
        return 0.0 if self.paused else max(0.0, now - self._accounted)

    def elapse(self) -> float:
        """Add the active time since the last call to the run's total; returns it (the store keeps it too)."""
        now = time.monotonic()
        delta = self._unaccounted(now)
        self._accounted = now
        self.usage.elapsed_s += delta
        self._session_active_s += delta
        return delta

    def pause(self) -> float:
        """Stop the clock (the time so far is counted first); returns the time counted, as `elapse` does."""
        delta = self.elapse()
        self.paused = True
        return delta

    def resume(self) -> None:
        """Start the clock again: the time spent paused is not counted."""
        if self.paused:
            self._accounted = time.monotonic()
            self.paused = False

    def _now_usage(self) -> BudgetUsage:
        """The usage with the active time not yet accounted added (accounting happens once a second)."""
        extra = self._unaccounted(time.monotonic())
        return self.usage.model_copy(update={"elapsed_s": self.usage.elapsed_s + extra}) if extra else self.usage

    def seconds_left(self) -> float | None:
        """Active seconds until the time cap (None: no cap); the search wakes then, not a poll later."""
        if self.budget.max_minutes is None:
            return None
        return self.budget.max_minutes * 60 - self._now_usage().elapsed_s

    def count(self, gpu_seconds: float, candidate: bool) -> None:
        """One evaluation's GPU time; `candidate`: it counts against the iteration budget (the root does not)."""
        self.usage.gpu_seconds += gpu_seconds
        self._session_gpu_s += gpu_seconds
        if candidate:
            self.usage.iterations += 1
            self._session_candidates += 1

    def spend(self, totals: LlmTotals) -> None:
        """The run's LLM use so far (the store's totals, which every recorded call updates)."""
        self.usage.money_nanousd = totals.cost_nanousd
        self.usage.tokens = totals.tokens

    def exhausted(self) -> str | None:
        return self._now_usage().exhausted(self.budget)

    def reached(self) -> tuple[str, str] | None:
        return self._now_usage().reached(self.budget)

    def clock_reached(self) -> bool:
        return self._now_usage().clock_reached(self.budget)

    def may_propose(self, in_flight: int) -> bool:
        return self.usage.may_propose(self.budget, in_flight)

    def set_lanes(self, lanes: int) -> None:
        self.lanes = lanes

    def session_stats(self) -> tuple[float, float]:
        """(candidates per minute, GPU busy share) of this session's active time so far (pauses left out)."""
        active = max(self._session_active_s + self._unaccounted(time.monotonic()), 1e-9)
        return self._session_candidates / active * 60, min(1.0, self._session_gpu_s / (active * self.lanes))

    def event(self) -> BudgetUsed:
        per_minute, busy = self.session_stats()
        b, u = self.budget, self.usage
        return BudgetUsed(
            iterations=u.iterations,
            max_iterations=b.max_iterations,
            elapsed_s=u.elapsed_s,
            max_seconds=b.max_minutes * 60 if b.max_minutes is not None else None,
            gpu_seconds=u.gpu_seconds,
            max_gpu_seconds=b.max_gpu_seconds,
            candidates_per_minute=per_minute,
            gpu_busy_share=busy,
            tokens=u.tokens,
            max_tokens=b.max_tokens,
            money_usd=u.money,
            max_money_usd=b.max_money,
        )
