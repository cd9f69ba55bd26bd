"""Where a search's LLM calls go: into the run's store, onto its event bus, and against its budgets.

Why here: the agents only ask; the engine decides what a call means for the run. Each ended call is committed
(with its tokens and cost) before it is announced, the money and token meters move from the store's own totals (so
a resumed run counts what was spent before the crash), and a budget reached by a call wakes the driver, which stops
the search cleanly and cancels the calls still being written.
"""

from __future__ import annotations

import asyncio

from kernelforge_tui.engine.budget import Meter
from kernelforge_tui.engine.events import EventBus
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.events import LlmCallEnded, LlmCallStarted, LlmText
from kernelforge_tui.vocabulary.llm import LlmCall, Role


class RunCallSink:
    """The engine's `CallSink` (llm.client): one per search."""

    def __init__(self, store: RunStore, bus: EventBus, meter: Meter, wake: asyncio.Event) -> None:
        self.store = store
        self.bus = bus
        self.meter = meter
        self.wake = wake

    def refused(self) -> str | None:
        """A budget the run's calls count against is spent: the next call would overspend it."""
        return self.meter.exhausted()

    def started(self, key: str, role: Role, provider: str, model: str, node_id: int | None) -> None:
        self.bus.emit(LlmCallStarted(call_key=key, role=role, provider=provider, model=model, node_id=node_id))

    def text(self, key: str, text: str, retry: bool) -> None:
        self.bus.emit(LlmText(call_key=key, text=text, retry=retry))

    def ended(self, key: str, call: LlmCall) -> LlmCall:
        recorded = self.store.record_llm_call(call)
        totals = self.store.llm_totals()
        self.meter.spend(totals)
        self.bus.emit(
            LlmCallEnded(call_key=key, call=recorded.model_copy(update={"prompt": None, "reply": None}), totals=totals)
        )
        if self.meter.exhausted() is not None:
            self.wake.set()
        return recorded
