"""Steering a run no process is writing (finished, stopped or interrupted): the flags a resume will read.

Why: a run that ended with a pin a person no longer wants (or a subtree to ban before going on) must not need a
live search to change it. A pin, a ban or an export mark is a flag on a node, which the next `--resume` reads
back with the tree, so it can be set while the run is at rest. The viewer becomes the run's writer only for the
moment it writes (`RunStore.resume` takes the writer lock, so a search that starts meanwhile is refused rather
than raced, and a live run is refused here: it is steered through its commands). Each command is recorded as
applied, with the same events and log lines a live search would write, so every viewer sees the change.
Commands that need a search to act (expand, inject, profile, hint, pause, stop) are refused with the way to
continue the run.
"""

from __future__ import annotations

from pathlib import Path

from kernelforge_tui.engine.tree import Tree
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.commands import BanSubtree, EngineCommand, MarkExport, PinSubtree
from kernelforge_tui.vocabulary.events import EngineEvent, LogLine, NodeChanged

AT_REST = (PinSubtree, BanSubtree, MarkExport)
"""The commands that act on a run at rest: flags on nodes, read back by the next resume."""


class NeedsLiveSearch(BadInput):
    """A command only a running search can act on, sent to a run at rest."""


def steer_at_rest(run_dir: Path, cmd: EngineCommand) -> list[EngineEvent]:
    """Apply a flag command to a run no process writes; the events recorded for it (a node's new view and a log
    line). StoreError while a search writes the run; NeedsLiveSearch for a command only a search can act on."""
    if not isinstance(cmd, AT_REST):
        raise NeedsLiveSearch(
            f"{cmd.kind} acts only on a running search: continue the run with `kernelforge open {run_dir} --resume`"
        )
    with RunStore.resume(run_dir) as store:
        command_id = store.record_command(cmd)
        events = _apply(store, cmd)
        for event in events:
            store.append_event(event)
        store.mark_applied(command_id)
    return events


def _apply(store: RunStore, cmd: PinSubtree | BanSubtree | MarkExport) -> list[EngineEvent]:
    tree = _flags(store)
    if cmd.node_id not in tree:
        return [LogLine(level="warning", text=f"no node {cmd.node_id} in this run: command ignored")]
    node_id = cmd.node_id
    if isinstance(cmd, MarkExport):
        return [NodeChanged(node=store.set_export(node_id, cmd.export))]
    if isinstance(cmd, BanSubtree):
        word = "banned" if cmd.banned else "unbanned"
        view = store.set_banned(node_id, cmd.banned)
        return [NodeChanged(node=view), LogLine(text=f"{word} node {node_id} (applied when the run resumes)")]
    problem = tree.pin_problem(node_id) if cmd.pinned else None
    if problem is not None:
        return [LogLine(level="warning", node_id=node_id, text=f"pin of node {node_id} refused: {problem}")]
    view = store.set_pinned(node_id, cmd.pinned)
    word = "pinned" if cmd.pinned else "unpinned"
    said = LogLine(node_id=node_id, text=f"{word} node {node_id} (applied when the run resumes)")
    return [NodeChanged(node=view), said]


def _flags(store: RunStore) -> Tree:
    """The run's tree with what a pin's check reads (statuses, failures, bans), no statistics replayed."""
    tree = Tree()
    for view in store.nodes():
        node = tree.add(view.id, view.parent_id)
        node.status, node.failure, node.banned, node.pinned = view.status, view.failure, view.banned, view.pinned
    return tree
