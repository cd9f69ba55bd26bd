"""A selection strategy that only ever expands the root: the smallest strategy a test can tell from MCTS."""

from __future__ import annotations

from kernelforge_tui.engine.tree import Tree


class RootOnly:
    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.calls = 0

    def select(self) -> int | None:
        self.calls += 1
        root = self.tree.root_id
        return root if root is not None and self.tree.may_expand(root) else None

    def expansion_size(self, node_id: int, forced: bool = False) -> int:
        return 2


def make(tree: Tree) -> RootOnly:
    return RootOnly(tree)
