"""Scoring: what one evaluation decided about a node, and its reward against its parent, every term kept.

Why apart from the search: the reward reads evidence from several places (the speedup measured now, the
ptxas stats of the build, an ncu profile that may arrive later, the parent's evidence, possibly from a run
resumed from the store), and a profile that arrives later rescores the node and its children.
"""

from __future__ import annotations

from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.expr import ExprError
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.config import RewardWeights
from kernelforge_tui.engine.reward import Evidence, compute_reward, failure_reward
from kernelforge_tui.engine.tree import Tree
from kernelforge_tui.store import RunStore, UnreadableRecord
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.nodes import FailureKind, NodeOutcome, NodeStatus
from kernelforge_tui.vocabulary.rewards import Reward

REASON_CHARS = 300
"""A failure's reason is cut to this many characters in rewards and log lines (the evaluation keeps it whole)."""


class Scorer:
    """Rewards for one run's nodes; measured evidence is kept in memory, read from the store after a resume."""

    def __init__(self, card: Card, store: RunStore, tree: Tree, weights: RewardWeights, threshold_pct: float) -> None:
        """`weights.failure` is replaced by the tree's `failure_reward`, so the stored reward and the tree agree."""
        self.card = card
        self.store = store
        self.tree = tree
        self.weights = weights.model_copy(update={"failure": tree.settings.failure_reward})
        self.threshold_pct = threshold_pct
        self._evidence: dict[int, Evidence] = {}

    def outcome(self, node_id: int, evaluation: Evaluation) -> NodeOutcome:
        """The node's status, measurements and reward, from its evaluation (before the tree records it)."""
        result = evaluation.result
        latency = result.candidate.median_us if result and result.candidate else None
        if not evaluation.ok:
            failure = evaluation.failure or FailureKind.WORKER
            reward = failure_reward(failure, evaluation.reason[:REASON_CHARS], self.weights)
            return NodeOutcome(
                status=NodeStatus.FAILED, failure=failure, reason=evaluation.reason, latency_us=latency, reward=reward
            )
        speedup = result.speedup if result else None
        scored: Reward | None = None
        if speedup is not None and speedup > 0:
            self._evidence[node_id] = self._measured(node_id, speedup, evaluation)
            scored = self.score(node_id)
        return NodeOutcome(
            status=NodeStatus.TIMED if speedup is not None else NodeStatus.VERIFIED,
            reason=evaluation.reason,
            latency_us=latency,
            speedup=speedup,
            speedup_interval=result.speedup_interval if result else None,
            ceiling_share=evaluation.ceiling_share,
            reward=scored,
        )

    def score(self, node_id: int) -> Reward | None:
        """The node's reward against its parent (alone for the root); None for a node with no speedup."""
        child = self._evidence_of(node_id)
        if child is None:
            return None
        parent_id = self.tree[node_id].parent_id
        parent = self._evidence_of(parent_id) if parent_id is not None else None
        return compute_reward(child, parent, weights=self.weights, threshold_pct=self.threshold_pct)

    def rescore(self, node_id: int) -> set[int]:
        """Score the node (a profile arrived) and its measured children again, store the rewards and the
        statistics they moved; the nodes whose value moved."""
        self._evidence.pop(node_id, None)
        rewards: dict[int, Reward] = {}
        touched: set[int] = set()
        for target in [node_id, *self.tree[node_id].children]:
            if not self.tree[target].measured:
                continue
            reward = self.score(target)
            if reward is None:
                continue
            self.tree.rescore(target, reward.total)
            rewards[target] = reward
            touched.update(a.id for a in self.tree.ancestors(target))
        self.store.save_rewards(rewards, self.tree.stats(touched))
        return touched

    def _evidence_of(self, node_id: int) -> Evidence | None:
        """A measured node's evidence (from memory, else from the store: a resumed run)."""
        known = self._evidence.get(node_id)
        if known is not None:
            return known
        node = self.tree[node_id]
        if not node.measured or node.speedup is None or node.speedup <= 0:
            return None
        evidence = self._measured(node_id, node.speedup, self.store.evaluation(node_id))
        self._evidence[node_id] = evidence
        return evidence

    def _measured(self, node_id: int, speedup: float, evaluation: Evaluation | None) -> Evidence:
        """What is known about a measured node: its speedup, its ptxas stats, its ncu metrics if profiled."""
        record = self.store.node_record(node_id)
        plan = record.plan
        build = evaluation.build if evaluation is not None else None
        ptxas = build.ptxas.get(plan.entry) if build is not None else None
        try:
            profile = self.store.profile(node_id)
        except UnreadableRecord:
            profile = None  # scored on its speedup and resources alone
        metrics = profile.profile.values() if profile is not None else None
        return Evidence(
            speedup=speedup,
            metrics=metrics,
            ptxas=ptxas,
            dynamic_shared=self._dynamic_shared(plan),
            judge_score=record.judge_score,
        )

    def _dynamic_shared(self, plan: LaunchPlan) -> int:
        try:
            return resolve(plan, self.card.spec).shared_bytes
        except ExprError:
            return 0
