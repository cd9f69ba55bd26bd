"""Selection strategies: which node of the revision tree the search expands next, one module each.

Why a protocol and a name-to-module map (as Kernel Tuner keeps `strategies/NAME.py`): the search asks a
strategy only which node to expand and how many children to ask for; everything else (proposing,
building, measuring, scoring, backing rewards up the `Tree`, steering) is the same for every strategy.
A new strategy (beam, evolutionary) is one module with a `make(tree)` function and one line in
`STRATEGIES`; a run names its strategy in `RunSettings.strategy`.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

from kernelforge_tui.engine.tree import Tree
from kernelforge_tui.errors import BadInput

DEFAULT_STRATEGY = "mcts"

STRATEGIES: dict[str, str] = {"mcts": "kernelforge_tui.engine.strategies.mcts"}
"""Strategy name -> the module implementing it; the module's `make(tree)` returns a `Strategy`."""


@runtime_checkable
class Strategy(Protocol):
    """Picks what to expand. It reads the shared `Tree` (statistics, steering flags) and never writes it."""

    def select(self) -> int | None:
        """The node to expand next, or None while every open branch waits on candidates in flight."""
        ...

    def expansion_size(self, node_id: int, forced: bool = False) -> int:
        """How many children to ask the proposer for (`forced`: a person asked for this node's children)."""
        ...


class UnknownStrategy(BadInput):
    """A strategy name with no module in `STRATEGIES`."""


def make_strategy(name: str, tree: Tree) -> Strategy:
    """The named strategy over `tree` (its module is imported only when a run uses it)."""
    path = STRATEGIES.get(name)
    if path is None:
        raise UnknownStrategy(f"no selection strategy {name!r}: use one of {', '.join(sorted(STRATEGIES))}")
    strategy = importlib.import_module(path).make(tree)
    if not isinstance(strategy, Strategy):
        raise UnknownStrategy(f"strategy {name!r} ({path}) does not follow the Strategy protocol")
    return strategy
