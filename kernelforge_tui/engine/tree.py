"""The revision tree: every candidate of a run, its outcome, and the statistics selection reads. Pure logic.

Why pure: every rule here (backing rewards up, pruning, ban and pin) is tested on small trees with
hand-computed numbers, and the search rebuilds the same tree from the store after a crash by replaying
the nodes. Which node to expand next is a selection strategy's call (`engine/strategies/`); the tree
keeps what every strategy reads.

Reward (to maximise; the search minimises latency through it):

    r(node) = the reward's total      for a measured node scored by `engine.reward.compute_reward`
    r(node) = ln(speedup)             for a measured node given no reward (speedup = baseline / node time)
    r(node) = failure_reward          for a failed node (default -1.0, as bad as a 2.7x slowdown)

The search passes the total of `compute_reward`: w_speedup * ln(speedup), plus hardware evidence capped
at +-0.1 and guardrail penalties; with no profiles and no wasted resources it is exactly ln(speedup).
Because ln(speedup) = ln(t_baseline) - ln(t_node), maximising r is minimising the log latency, and a
2x gain weighs the same at 10 us as at 10 ms. Every measured or failed node adds its reward to itself and
each ancestor (`visits` += 1, `value` += r) and raises the subtree's `best` reward where it beats it. A
reward can change after the fact (a profile arrives): `rescore` moves the difference through every
ancestor's value and recomputes their best.

A subtree whose best reward has not improved for `prune_after` visits is pruned (not selected again unless
pinned, or until the search, with nothing else left to expand, reopens every pruned subtree). A banned
subtree is never expanded; while any node is pinned, selection stays inside the
pinned subtrees. A pin reopens the path to its node: pruned ancestors on it are unpruned (and are not pruned
again while the pin holds), so a pin never points selection at a node it cannot reach; a pin that cannot act
(a failed node, a banned subtree) is refused with the reason (`pin_problem`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.vocabulary.nodes import IN_FLIGHT, MEASURED, FailureKind, NodeStats, NodeStatus, ParamValue


class TreeSettings(BaseModel):
    """The constants of the tree search (the tree's and the MCTS strategy's). Defaults suit the template
    proposer on one GPU."""

    model_config = ConfigDict(extra="forbid")

    exploration: float = Field(default=0.5, ge=0)
    """UCT exploration weight c. Rewards are log speedups (a 2x gain is 0.69), so c near 0.5 balances them."""
    widening_k: float = Field(default=2.0, gt=0)
    """Progressive widening: a node may have ceil(k * visits^alpha) children."""
    widening_alpha: float = Field(default=0.5, ge=0, le=1)
    """Progressive widening exponent: 0 fixes the number of children at ceil(k); 1 grows it with every visit."""
    expand_batch: int = Field(default=4, ge=1)
    """Children asked of the proposer per expansion, at most (fewer when widening allows fewer)."""
    max_weight: float = Field(default=0.5, ge=0, le=1)
    """Share of the subtree's best reward in Q; the rest is the mean reward. 0 is classic UCT."""
    failure_reward: float = -1.0
    """Reward of a failed candidate (compile, launch, mismatch, timeout, cheat): ln(0.37), a 2.7x slowdown."""
    prune_after: int = Field(default=24, ge=1)
    """A subtree (other than the root) whose best reward did not improve for this many visits is pruned."""
    improvement_epsilon: float = Field(default=0.01, ge=0)
    """Reward gain that counts as an improvement for pruning (0.01 is a 1% speedup): noise is not progress."""


@dataclass
class TreeNode:
    """One candidate in the tree: its status, measurements, statistics and steering flags."""

    id: int
    parent_id: int | None
    params: dict[str, ParamValue] = field(default_factory=dict)
    mutation: str = ""
    status: NodeStatus = NodeStatus.PROPOSED
    failure: FailureKind | None = None
    reason: str = ""
    speedup: float | None = None
    children: list[int] = field(default_factory=list)
    visits: int = 0
    """Measured or failed nodes in this subtree, itself included."""
    value: float = 0.0
    """Sum of their rewards."""
    best: float = -math.inf
    """Best reward in this subtree."""
    visits_at_best: int = 0
    """`visits` when `best` last improved by more than the epsilon (for pruning)."""
    banned: bool = False
    pinned: bool = False
    pruned: bool = False
    exhausted: bool = False
    """The proposer had nothing new for this node: it is not expanded again."""
    expanding: bool = False
    """A proposer is writing children of this node now: it is not selected again until it is done."""
    repair_of: int | None = None
    """The failed sibling this node repairs (an LLM debugger's fix)."""
    hints: list[str] = field(default_factory=list)
    score: float | None = None
    """The reward given for this measured node (None: ln(speedup) is used)."""

    @property
    def in_flight(self) -> bool:
        return self.status in IN_FLIGHT

    @property
    def measured(self) -> bool:
        return self.status in MEASURED

    @property
    def mean(self) -> float:
        return self.value / self.visits if self.visits else 0.0


class Tree:
    """The revision tree with its selection rules. Node ids come from the store; the first node is the root."""

    def __init__(self, settings: TreeSettings | None = None) -> None:
        self.settings = settings or TreeSettings()
        self.nodes: dict[int, TreeNode] = {}
        self.root_id: int | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, node_id: int) -> TreeNode:
        return self.nodes[node_id]

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.nodes

    @property
    def root(self) -> TreeNode:
        if self.root_id is None:
            raise LookupError("the tree has no root yet")
        return self.nodes[self.root_id]

    def add(
        self,
        node_id: int,
        parent_id: int | None,
        params: dict[str, ParamValue] | None = None,
        mutation: str = "",
        repair_of: int | None = None,
    ) -> TreeNode:
        """A new, unmeasured node under `parent_id` (None: the root)."""
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} is already in the tree")
        if parent_id is None:
            if self.root_id is not None:
                raise ValueError("the tree already has a root")
            self.root_id = node_id
        elif parent_id not in self.nodes:
            raise KeyError(f"parent {parent_id} of node {node_id} is not in the tree")
        node = TreeNode(
            id=node_id, parent_id=parent_id, params=dict(params or {}), mutation=mutation, repair_of=repair_of
        )
        self.nodes[node_id] = node
        if parent_id is not None:
            self.nodes[parent_id].children.append(node_id)
        return node

    def ancestors(self, node_id: int) -> Iterator[TreeNode]:
        """The node itself, then its parent, up to the root."""
        current: int | None = node_id
        while current is not None:
            node = self.nodes[current]
            yield node
            current = node.parent_id

    def subtree(self, node_id: int) -> Iterator[TreeNode]:
        stack = [node_id]
        while stack:
            node = self.nodes[stack.pop()]
            yield node
            stack.extend(reversed(node.children))

    # ---- measurements -------------------------------------------------------------------------------

    def reward(self, node: TreeNode) -> float:
        """The given score, else ln(speedup), for a measured node; `failure_reward` for a failed one."""
        if node.status == NodeStatus.FAILED:
            return self.settings.failure_reward
        if node.score is not None:
            return node.score
        if node.speedup is None or node.speedup <= 0:
            return 0.0  # proven correct but not timed against the baseline: neutral
        return math.log(node.speedup)

    def mark_built(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.status == NodeStatus.PROPOSED:
            node.status = NodeStatus.BUILT

    def finish(
        self,
        node_id: int,
        status: NodeStatus,
        speedup: float | None = None,
        failure: FailureKind | None = None,
        reason: str = "",
        score: float | None = None,
    ) -> list[int]:
        """Record a node's outcome and back its reward up to the root; returns the nodes newly pruned.

        `score`: the node's reward (the total of `compute_reward`); None uses ln(speedup)."""
        node = self.nodes[node_id]
        if not node.in_flight:
            raise ValueError(f"node {node_id} is already {node.status}")
        if status in IN_FLIGHT:
            raise ValueError(f"finish needs a final status, not {status!r}")
        node.status, node.speedup, node.failure, node.reason = status, speedup, failure, reason
        node.score = score
        reward = self.reward(node)
        newly_pruned: list[int] = []
        eps = self.settings.improvement_epsilon
        kept_open: set[int] | None = None  # found only when a node is due to be pruned (rare)
        for ancestor in self.ancestors(node_id):
            ancestor.visits += 1
            ancestor.value += reward
            if reward > ancestor.best + eps or ancestor.best == -math.inf:
                ancestor.visits_at_best = ancestor.visits
            ancestor.best = max(ancestor.best, reward)
            if (
                ancestor.id != self.root_id
                and not ancestor.pruned
                and ancestor.visits - ancestor.visits_at_best >= self.settings.prune_after
            ):
                kept_open = self.pinned_paths() if kept_open is None else kept_open
                if ancestor.id not in kept_open:
                    ancestor.pruned = True
                    newly_pruned.append(ancestor.id)
        return newly_pruned

    def rescore(self, node_id: int, score: float) -> None:
        """Replace a measured node's reward: its ancestors' value moves by the difference, their best is
        recomputed over their subtree (pruning counts an improvement beyond the epsilon as progress)."""
        node = self.nodes[node_id]
        if node.in_flight or node.status == NodeStatus.FAILED:
            raise ValueError(f"node {node_id} is {node.status}: only a measured node can be rescored")
        old = self.reward(node)
        node.score = score
        delta = score - old
        eps = self.settings.improvement_epsilon
        for ancestor in self.ancestors(node_id):
            ancestor.value += delta
            best = max((self.reward(n) for n in self.subtree(ancestor.id) if not n.in_flight), default=-math.inf)
            if best > ancestor.best + eps:
                ancestor.visits_at_best = ancestor.visits
            ancestor.best = best

    # ---- what every strategy respects ---------------------------------------------------------------

    def pin_scope(self) -> tuple[set[int], set[int]]:
        """(nodes inside a pinned subtree, strict ancestors of pinned nodes); both empty without pins."""
        pinned = [n.id for n in self.nodes.values() if n.pinned]
        inside: set[int] = set()
        above: set[int] = set()
        for pin in pinned:
            inside.update(n.id for n in self.subtree(pin))
            above.update(n.id for n in self.ancestors(pin) if n.id != pin)
        return inside, above - inside

    def pinned_paths(self) -> set[int]:
        """The pinned nodes and their ancestors: the paths a pin keeps open (never pruned while it holds)."""
        return {a.id for n in self.nodes.values() if n.pinned for a in self.ancestors(n.id)}

    def pin_problem(self, node_id: int) -> str | None:
        """Why pinning this node could not steer the search anywhere (said when the pin is refused), or None."""
        node = self.nodes[node_id]
        if node.status == NodeStatus.FAILED:
            return f"node {node_id} failed ({node.failure or 'failed'}): nothing is proposed under a failed kernel"
        banned = next((a.id for a in self.ancestors(node_id) if a.banned), None)
        if banned == node_id:
            return f"node {node_id} is banned: unban it first"
        if banned is not None:
            return f"node {node_id} is in the banned subtree of node {banned}: unban node {banned} first"
        return None

    def may_expand(self, node_id: int) -> bool:
        """May this node take a child at all (what a person's ExpandNode needs): measured, not exhausted, and
        not in a banned subtree. A strategy adds its own rules (widening, pruning) on top."""
        node = self.nodes[node_id]
        if not node.measured or node.exhausted or node.expanding:
            return False
        return not any(a.banned for a in self.ancestors(node_id))

    # ---- what the proposer is told ------------------------------------------------------------------

    def failed_children(self, node_id: int) -> list[TreeNode]:
        return [self.nodes[c] for c in self.nodes[node_id].children if self.nodes[c].status == NodeStatus.FAILED]

    def repair_round(self, node_id: int) -> int:
        """How many repairs led to this node: 0 for a node that repairs nothing."""
        rounds = 0
        node = self.nodes[node_id]
        while node.repair_of is not None and node.repair_of in self.nodes:
            rounds += 1
            node = self.nodes[node.repair_of]
        return rounds

    def repaired(self, node_id: int) -> bool:
        """A repair of this node is in the tree already."""
        parent = self.nodes[node_id].parent_id
        siblings = self.nodes[parent].children if parent is not None else []
        return any(self.nodes[c].repair_of == node_id for c in siblings)

    def children_params(self, node_id: int) -> list[dict[str, ParamValue]]:
        return [dict(self.nodes[c].params) for c in self.nodes[node_id].children]

    def hints_for(self, node_id: int) -> list[str]:
        """Hints on the node and its ancestors, nearest first: a hint on the root applies everywhere."""
        return [hint for node in self.ancestors(node_id) for hint in reversed(node.hints)]

    # ---- steering -----------------------------------------------------------------------------------

    def ban(self, node_id: int, banned: bool = True) -> None:
        self.nodes[node_id].banned = banned

    def pin(self, node_id: int, pinned: bool = True) -> list[int]:
        """Pin or unpin a subtree. A pin reopens the path to its node: the pruned nodes on it (the node itself
        included) are unpruned, their stagnation counted from now; returns them, root side first."""
        node = self.nodes[node_id]
        node.pinned = pinned
        if not pinned:
            return []
        return _unprune(self.ancestors(node_id))[::-1]

    def reopen_pruned(self) -> list[int]:
        """Unprune every pruned subtree that is not banned, its stagnation counted from now; returns them."""
        return _unprune(n for n in self.nodes.values() if not n.banned)

    def best_node(self) -> TreeNode | None:
        """The measured node with the highest speedup."""
        timed = [n for n in self.nodes.values() if n.measured and n.speedup is not None]
        return max(timed, key=lambda n: (n.speedup or 0.0, -n.id), default=None)

    def stats(self, node_ids: Iterable[int]) -> dict[int, NodeStats]:
        """What the store keeps of these nodes' statistics."""
        return {i: NodeStats(visits=self.nodes[i].visits, value=self.nodes[i].mean) for i in node_ids}


def _unprune(nodes: Iterable[TreeNode]) -> list[int]:
    """Unprune the pruned ones among `nodes`, their stagnation counted from now; their ids, in the given order."""
    reopened = [node for node in nodes if node.pruned]
    for node in reopened:
        node.pruned = False
        node.visits_at_best = node.visits
    return [node.id for node in reopened]
