"""Start the TUI: on a new in-process search over a card (`kernelforge tui`), on a run's store (`open`), or on a
recorded run continued in place (`open --resume`).

A run that is over (finished, stopped, interrupted) opens with a line saying how to continue it, in the log and on
the console when the TUI closes; where its directory can be written, its pins, bans and export marks can be changed
at rest (`engine.at_rest`: read back by the next resume).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING

from kernelforge_tui.tui import apply_ssh_defaults
from kernelforge_tui.tui.config import TuiSettings, load_tui_settings
from kernelforge_tui.tui.source import StoreSource

if TYPE_CHECKING:
    from kernelforge_tui.engine.budget import Budget
    from kernelforge_tui.engine.search import Search
    from kernelforge_tui.engine.view import Snapshot
    from kernelforge_tui.store import RunStore
    from kernelforge_tui.vocabulary.commands import EngineCommand
    from kernelforge_tui.vocabulary.events import EngineEvent


def new_search(
    card_dir: Path,
    budget: Budget,
    *,
    proposer: str | None = None,
    simulate: bool = False,
    simulate_seconds: float = 0.01,
    cluster: str | None = None,
) -> Search:
    """A search on a new run of the card, set up as `optimize` sets one up: the same proposers (an LLM team's
    calls included), budgets and backend (whoever runs it closes its store)."""
    from kernelforge_tui.config import load_settings
    from kernelforge_tui.engine.setup import RunOptions, prepare_run

    options = RunOptions(
        budget=budget, proposer=proposer, simulate=simulate, simulate_seconds=simulate_seconds, cluster=cluster
    )
    return prepare_run(card_dir, load_settings(), options)


def continued_search(
    run: str, budget: Budget, *, simulate: bool = False, simulate_seconds: float = 0.01, cluster: str | None = None
) -> Search:
    """A recorded run continued in this process as `optimize --resume` continues it: its card, settings and kind of
    backend (a simulated run goes on simulated, `--simulate` or not; one measured on a GPU needs a GPU here). New caps
    replace the recorded ones; a cap the run has spent must be raised (the refusal says which)."""
    from kernelforge_tui.config import load_settings
    from kernelforge_tui.engine.backend import SIMULATED
    from kernelforge_tui.engine.setup import RunOptions, prepare_run, recorded_run

    recorded = recorded_run(run)
    simulated = simulate or recorded.info.backend == SIMULATED
    options = RunOptions(
        resume=str(recorded.run_dir),
        budget=budget,
        simulate=simulated,
        simulate_seconds=simulate_seconds,
        cluster=cluster,
    )
    return prepare_run(None, load_settings(), options)


def _drive(search: Search, settings: TuiSettings) -> str:
    """The TUI over a search in this process until it quits; the line saying where the run is and how to go on."""
    from kernelforge_tui.engine.setup import stored_resume_command
    from kernelforge_tui.tui.app import KernelForgeApp
    from kernelforge_tui.tui.source import LiveSearchSource

    app = KernelForgeApp(LiveSearchSource(search, search.store), settings)
    try:
        app.run()
    finally:
        search.store.close()
    run_dir = search.store.run_dir
    return (
        f"run stored in {run_dir}: `kernelforge open` it, or continue it with `kernelforge open {run_dir} --resume` "
        f"(or `{stored_resume_command(run_dir)}`)"
    )


def run_tui(
    card_dir: Path,
    budget: Budget,
    *,
    theme: str | None = None,
    proposer: str | None = None,
    simulate: bool = False,
    simulate_seconds: float = 0.01,
    cluster: str | None = None,
) -> str:
    """Search a card under the TUI; the line saying where the run is stored and how to continue it."""
    apply_ssh_defaults()
    settings = load_tui_settings(theme=theme)
    search = new_search(
        card_dir, budget, proposer=proposer, simulate=simulate, simulate_seconds=simulate_seconds, cluster=cluster
    )
    return _drive(search, settings)


def open_run(
    run: str,
    *,
    theme: str | None = None,
    resume: bool = False,
    budget: Budget | None = None,
    simulate: bool = False,
    simulate_seconds: float = 0.01,
    cluster: str | None = None,
) -> str | None:
    """Open a run: follow it live in another process, view it when it is over, or (`resume`) continue it here under
    the TUI. Returns what to tell the person when the TUI closes (how to continue a run that is over), or None."""
    from kernelforge_tui.engine.budget import Budget
    from kernelforge_tui.errors import BadInput
    from kernelforge_tui.tui.app import KernelForgeApp

    budget = budget or Budget()
    if not resume and (budget != Budget() or simulate or cluster):
        raise BadInput("budgets, --simulate and --cluster are for continuing the run: add --resume")
    apply_ssh_defaults()
    settings = load_tui_settings(theme=theme)
    if resume:
        search = continued_search(run, budget, simulate=simulate, simulate_seconds=simulate_seconds, cluster=cluster)
        return _drive(search, settings)
    source = open_source(run)
    KernelForgeApp(source, settings).run()
    return source.note if isinstance(source, RestingRunSource) else None


def open_source(run: str) -> StoreSource:
    """The source `open` views a run through: a run live in another process is followed and steered through its
    commands; a run that is over comes with the note saying how to continue it, and with its flags steerable at
    rest where its directory can be written."""
    from kernelforge_tui.engine.setup import continue_note
    from kernelforge_tui.store import resolve_run

    source = StoreSource.open(resolve_run(run))
    if source.can_steer:
        return source
    resting = RestingRunSource(source.store, continue_note(source.store.run_info()))
    if resting.note is not None and not resting.can_steer:
        resting.note += f" (after copying it to a directory you can write: {source.store.run_dir} cannot be written)"
    return resting


class RestingRunSource(StoreSource):
    """A run no process writes, viewed: pins, bans and export marks are written to its store at once (the events
    they record come back through the store like a writer's), other commands are answered in the log with the way
    to continue the run; `note` (how to continue it) heads the log."""

    def __init__(self, store: RunStore, note: str | None) -> None:
        super().__init__(store)
        self.note = note
        self._writable = os.access(store.run_dir, os.W_OK) and os.access(store.run_dir / "run.sqlite", os.W_OK)
        self._detached = False
        self._answers: list[EngineEvent] = []

    @property
    def can_steer(self) -> bool:
        """Whether flag commands can be written (the directory is writable and the view is open)."""
        return self._writable and not self._detached

    def snapshot(self) -> Snapshot:
        from kernelforge_tui.vocabulary.events import LogLine

        snapshot = super().snapshot()
        if self.note is None:
            return snapshot
        return snapshot.model_copy(update={"logs": [*snapshot.logs, LogLine(text=self.note)]})

    async def send(self, command: EngineCommand) -> None:
        from kernelforge_tui.engine.at_rest import steer_at_rest
        from kernelforge_tui.errors import KernelForgeError
        from kernelforge_tui.vocabulary.events import LogLine

        if not self.can_steer:
            self._answers.append(LogLine(level="warning", text=f"{self.store.run_dir} cannot be written here"))
            return
        try:
            await asyncio.to_thread(steer_at_rest, self.store.run_dir, command)
        except KernelForgeError as exc:  # a writer started meanwhile, or a command only a search can act on
            self._answers.append(LogLine(level="warning", text=str(exc)))

    async def poll_events(self, limit: int = 5000) -> list[EngineEvent]:
        events = await super().poll_events(limit)
        answers, self._answers = self._answers, []
        return events + answers

    async def close(self) -> None:
        self._detached = True
        await super().close()
