"""Start the TUI: on a new in-process search over a card (`kernelforge tui`), or on a run's store (`open`)."""

from __future__ import annotations

from pathlib import Path

from kernelforge_tui.tui import apply_ssh_defaults
from kernelforge_tui.tui.config import load_tui_settings


def new_search(card_dir: Path, budget_iters: int | None, budget_minutes: float | None, simulate: bool) -> object:
    """A `Search` on a new run of the card, with the template proposer (the same set-up as `optimize`)."""
    from kernelforge_tui.cards import load_card
    from kernelforge_tui.config import load_settings
    from kernelforge_tui.engine.budget import Budget
    from kernelforge_tui.engine.search import Search
    from kernelforge_tui.engine.setup import DEFAULT_PROPOSER, load_proposer, make_backend, new_run_settings
    from kernelforge_tui.store import RunStore, new_run_dir

    settings = load_settings()
    card = load_card(card_dir)
    run_settings = new_run_settings(settings, Budget(max_iterations=budget_iters, max_minutes=budget_minutes))
    backend = make_backend(card, settings, simulate=simulate)
    store = RunStore.create(new_run_dir(card.spec.name), card, backend.name, backend.gpu_name, run_settings)
    proposer = load_proposer(DEFAULT_PROPOSER)
    return Search(card, proposer, backend, store, run_settings.budget, run_settings.tree, run_settings.pipeline,
                  profile=settings.profile, reward=settings.reward)  # fmt: skip


def run_tui(
    card_dir: Path,
    *,
    theme: str | None = None,
    budget_iters: int | None = None,
    budget_minutes: float | None = None,
    simulate: bool = False,
) -> str:
    """Search a card under the TUI; the run directory (resumable with `optimize --resume`)."""
    apply_ssh_defaults()
    from kernelforge_tui.tui.app import KernelForgeApp
    from kernelforge_tui.tui.source import LiveSearchSource

    settings = load_tui_settings(theme=theme)
    search = new_search(card_dir, budget_iters, budget_minutes, simulate)
    store = getattr(search, "store", None)
    app = KernelForgeApp(LiveSearchSource(search, store), settings)
    try:
        app.run()
    finally:
        if store is not None:
            store.close()
    return str(getattr(store, "run_dir", ""))


def open_run(run: str, *, theme: str | None = None) -> None:
    """Open a finished run, or follow one live in another process."""
    apply_ssh_defaults()
    from kernelforge_tui.store import resolve_run
    from kernelforge_tui.tui.app import KernelForgeApp
    from kernelforge_tui.tui.source import StoreSource

    settings = load_tui_settings(theme=theme)
    source = StoreSource.open(resolve_run(run))
    KernelForgeApp(source, settings).run()
