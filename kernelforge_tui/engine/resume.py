"""Resuming a run from its store: the tree replayed, the budget spent so far, the candidates left in flight.

A Search built on a store that already holds nodes restores the tree by replaying them (nodes in id
order, outcomes in the order they were measured). Nodes that were in flight when the previous process
died (proposed or built, never measured) are queued again once: their source and plan are in the store,
and the build cache makes the rebuild free. A node that was already queued again once and is in flight
again is failed (kind "worker", reason "lost in flight"): it may be what killed the process.

A node stored before candidates had identities (schema 6) is given one, and the store keeps it: its template's
when today's render of its params is its stored source and plan, else its source and plan's (a kernel an older
render made is another candidate than today's render of the same params).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.engine.budget import BudgetUsage
from kernelforge_tui.engine.pipeline import Pipeline
from kernelforge_tui.engine.promotion import Champion, timed_pair
from kernelforge_tui.engine.tree import Tree
from kernelforge_tui.proposers.templates import template_for
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.evaluation import Evaluation
from kernelforge_tui.vocabulary.identity import SourceIdentity, TemplateIdentity, source_identity
from kernelforge_tui.vocabulary.nodes import IN_FLIGHT, FailureKind, NodeRecord, NodeStatus

LOST_IN_FLIGHT = "lost in flight"
MAX_ATTEMPTS = 2
"""A node is handed to the pipeline at most this many times (the first run, then one resume)."""


@dataclass
class Restored:
    """What a run's store held, once replayed into the tree and the pipeline."""

    in_flight: list[tuple[int, int]]
    """(node id, times it was handed to the pipeline) of the nodes never measured."""
    profiled: set[int]
    usage: BudgetUsage
    champion: Champion
    """The run's best as it was promoted, with the timings a challenger is judged against."""


def identity_of(card: OperatorCard, rec: NodeRecord) -> TemplateIdentity | SourceIdentity:
    """The node's identity: as stored, or for a node stored without one, as the module's docstring says."""
    if rec.identity is not None:
        return rec.identity
    template = template_for(card) if rec.params else None
    params = template.valid(card, rec.params) if template is not None else None
    if template is not None and params is not None and template.render(card, params) == (rec.source, rec.plan):
        return template.identity(params)
    return source_identity(rec.source, rec.plan)


def restore(store: RunStore, tree: Tree, pipeline: Pipeline) -> Restored:
    """Replay the store's nodes into an empty tree (and their identities into the pipeline's seen set)."""
    records = store.node_records()
    derived: dict[int, TemplateIdentity | SourceIdentity] = {}
    for rec in records:
        node = tree.add(rec.id, rec.parent_id, rec.params, rec.mutation, rec.repair_of)
        node.banned, node.pinned, node.hints = rec.banned, rec.pinned, list(rec.hints)
        identity = identity_of(pipeline.card, rec)
        if rec.identity is None:
            derived[rec.id] = identity
        pipeline.remember(rec.id, identity)
    if derived:
        store.set_identities(derived)
    usage = BudgetUsage()
    done = [r for r in records if r.last_measurement is not None and r.status not in IN_FLIGHT]
    for rec in sorted(done, key=lambda r: r.last_measurement or 0):
        score = rec.reward.total if rec.reward is not None and rec.status != NodeStatus.FAILED else None
        tree.finish(rec.id, rec.status, rec.speedup, rec.failure, rec.reason, score)
        if rec.id != tree.root_id:
            usage.iterations += 1
    totals = store.llm_totals()
    usage.money_nanousd, usage.tokens = totals.cost_nanousd, totals.tokens
    champion = Champion()
    if records:
        info = store.run_info()
        usage.elapsed_s, usage.gpu_seconds = info.active_seconds, info.gpu_seconds
        if info.best_node_id is not None:
            pair = timed_pair(store.evaluation(info.best_node_id))
            champion = Champion(info.best_node_id, info.best_speedup, pair)
    return Restored(
        in_flight=[(r.id, r.attempts) for r in records if r.status in IN_FLIGHT],
        profiled=store.profiled_ids() if records else set(),
        usage=usage,
        champion=champion,
    )


def lost(attempts: int) -> Evaluation | None:
    """The verdict on a node found in flight after `attempts` hand-overs: None while it may be tried again."""
    if attempts < MAX_ATTEMPTS:
        return None
    return Evaluation(ok=False, failure=FailureKind.WORKER, reason=f"{LOST_IN_FLIGHT} {attempts} times")
