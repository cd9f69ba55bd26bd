"""Monte Carlo tree search: UCT for minimisation with progressive widening, the search's first strategy.

Selection descends from the root by UCT, written on rewards (`Tree.reward`: log speedups and more):

    Q(child)   = (1 - max_weight) * value / visits + max_weight * best
    UCT(child) = Q(child) + exploration * sqrt(ln(visits(parent)) / visits(child))

Mixing in the best reward matters for optimisation: one fast kernel in a subtree is worth more than a
good average. Progressive widening stops at the first node that may take another child:

    children allowed(node) = ceil(widening_k * max(1, visits(node)) ** widening_alpha)

so a node first gets a few children and more as its subtree proves itself. Pruned and banned subtrees
are skipped; while nodes are pinned, only their subtrees (and the path to them, pruned or not) are visited.
"""

from __future__ import annotations

import math

from kernelforge_tui.engine.tree import Tree, TreeNode


class Mcts:
    """UCT selection over the shared tree; its constants are the tree's `TreeSettings`."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    def allowed_children(self, node: TreeNode) -> int:
        """Progressive widening: ceil(k * max(1, visits)^alpha)."""
        s = self.tree.settings
        grown: float = s.widening_k * math.pow(max(1, node.visits), s.widening_alpha)
        return math.ceil(grown - 1e-9)

    def q(self, node: TreeNode) -> float:
        s = self.tree.settings
        best = node.best if node.best != -math.inf else s.failure_reward
        return (1 - s.max_weight) * node.mean + s.max_weight * best

    def uct(self, child: TreeNode, parent: TreeNode) -> float:
        """Q(child) + c * sqrt(ln(N(parent)) / N(child)); +inf for an unvisited child."""
        if child.visits == 0:
            return math.inf
        explore = math.sqrt(math.log(max(parent.visits, 1)) / child.visits)
        return self.q(child) + self.tree.settings.exploration * explore

    def select(self) -> int | None:
        if self.tree.root_id is None:
            return None
        inside, above = self.tree.pin_scope()
        return self._select(self.tree.root, inside, above, bool(inside))

    def _select(self, node: TreeNode, inside: set[int], above: set[int], pins: bool) -> int | None:
        if node.banned or not node.measured:
            return None
        if node.pruned and node.id not in inside and node.id not in above:
            return None
        in_scope = not pins or node.id in inside
        if in_scope and not node.exhausted and not node.expanding and len(node.children) < self.allowed_children(node):
            return node.id
        nodes = self.tree.nodes
        children = [nodes[c] for c in node.children if nodes[c].measured and (not pins or c in inside or c in above)]
        children.sort(key=lambda child: (-self.uct(child, node), child.id))
        for child in children:
            found = self._select(child, inside, above, pins)
            if found is not None:
                return found
        return None

    def expansion_size(self, node_id: int, forced: bool = False) -> int:
        """The widening room, capped by `expand_batch` (a forced expansion asks for a whole batch)."""
        batch = self.tree.settings.expand_batch
        if forced:
            return batch
        node = self.tree[node_id]
        return max(1, min(batch, self.allowed_children(node) - len(node.children)))


def make(tree: Tree) -> Mcts:
    return Mcts(tree)
