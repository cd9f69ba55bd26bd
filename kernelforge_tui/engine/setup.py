"""Setting up a new run: one place for what `kernelforge optimize` and `kernelforge tui` both start.

The CLI and the TUI are two views of the same engine, so they build its parts the same way: the
proposer by name, the backend (the GPUs, or the simulation), and the settings a run records.
"""

from __future__ import annotations

import importlib

from kernelforge_tui.cards.store import Card
from kernelforge_tui.config import Settings
from kernelforge_tui.engine.backend import GpuBackend, SimulatedBackend, make_builder
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.mcts import TreeSettings
from kernelforge_tui.engine.search import PipelineSettings, RunSettings
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.proposers.base import Proposer

DEFAULT_PROPOSER = "templates"


def load_proposer(spec: str) -> Proposer:
    """`templates` (the built-in library) or `module:Class` (any class following the Proposer protocol)."""
    if spec == DEFAULT_PROPOSER:
        from kernelforge_tui.proposers.templates import TemplateProposer

        return TemplateProposer()
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"--proposer {spec!r}: give 'templates' or 'module:Class'")
    proposer = getattr(importlib.import_module(module_name), attr)()
    if not isinstance(proposer, Proposer):
        raise ValueError(f"--proposer {spec!r} does not follow the Proposer protocol (name, propose, seeds)")
    return proposer


def make_backend(
    card: Card, settings: Settings, *, simulate: bool, simulate_seconds: float = 0.01
) -> SimulatedBackend | GpuBackend:
    """The simulation (real builds, invented timings) or every visible GPU; NoGpuError when there is none."""
    if simulate:
        return SimulatedBackend(card, make_builder(settings), eval_seconds=simulate_seconds)
    return GpuBackend(card, settings, require_gpu())


def new_run_settings(
    settings: Settings, budget: Budget, tree: TreeSettings | None = None, proposer: str = DEFAULT_PROPOSER
) -> RunSettings:
    """What a new run records about how it searches."""
    return RunSettings(
        tree=tree or TreeSettings(),
        pipeline=PipelineSettings(build_parallel=max(1, settings.build.max_parallel)),
        budget=budget,
        proposer=proposer,
        app=settings.model_dump(mode="json"),
    )
