"""Start the TUI: on a new in-process search over a card (`kernelforge tui`), or on a run's store (`open`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kernelforge_tui.tui import apply_ssh_defaults
from kernelforge_tui.tui.config import load_tui_settings

if TYPE_CHECKING:
    from kernelforge_tui.engine.budget import Budget
    from kernelforge_tui.engine.search import Search


def new_search(card_dir: Path, budget: Budget, *, proposer: str | None = None, simulate: bool = False) -> Search:
    """A search on a new run of the card, set up as `optimize` sets one up: the same proposers (an LLM team's
    calls included) and budgets (whoever runs it closes its store)."""
    from kernelforge_tui.config import load_settings
    from kernelforge_tui.engine.setup import RunOptions, prepare_run

    options = RunOptions(budget=budget, proposer=proposer, simulate=simulate)
    return prepare_run(card_dir, load_settings(), options)


def run_tui(
    card_dir: Path,
    budget: Budget,
    *,
    theme: str | None = None,
    proposer: str | None = None,
    simulate: bool = False,
) -> str:
    """Search a card under the TUI; the run directory (resumable with `optimize --resume`)."""
    apply_ssh_defaults()
    from kernelforge_tui.tui.app import KernelForgeApp
    from kernelforge_tui.tui.source import LiveSearchSource

    settings = load_tui_settings(theme=theme)
    search = new_search(card_dir, budget, proposer=proposer, simulate=simulate)
    app = KernelForgeApp(LiveSearchSource(search, search.store), settings)
    try:
        app.run()
    finally:
        search.store.close()
    return str(search.store.run_dir)


def open_run(run: str, *, theme: str | None = None) -> None:
    """Open a finished run, or follow one live in another process."""
    apply_ssh_defaults()
    from kernelforge_tui.store import resolve_run
    from kernelforge_tui.tui.app import KernelForgeApp
    from kernelforge_tui.tui.source import StoreSource

    settings = load_tui_settings(theme=theme)
    source = StoreSource.open(resolve_run(run))
    KernelForgeApp(source, settings).run()
