"""Steering: what each command a view sends does to the search, one handler per command type.

Commands arrive from an in-process view (`Search.send`) or from another process through the store
(polled). Each is applied whole between two steps of the search (handlers are synchronous) and never ends
it: a command for a node the run does not hold is ignored with a warning in the log.
"""

from __future__ import annotations

from functools import singledispatchmethod
from typing import TYPE_CHECKING

from kernelforge_tui.engine.feedback import hint_feedback
from kernelforge_tui.engine.pipeline import Priority
from kernelforge_tui.engine.profile_schedule import ProfileReason
from kernelforge_tui.proposers.base import Proposal
from kernelforge_tui.vocabulary.commands import (
    AddHint,
    BanSubtree,
    Command,
    EngineCommand,
    ExpandNode,
    InjectKernel,
    MarkExport,
    Pause,
    PinSubtree,
    ProfileNode,
    Resume,
    Stop,
)
from kernelforge_tui.vocabulary.events import NodeChanged
from kernelforge_tui.vocabulary.runs import UnreadableRow

if TYPE_CHECKING:
    from kernelforge_tui.engine.search import Search


class CommandHandler:
    """Applies commands to one search."""

    def __init__(self, search: Search) -> None:
        self.search = search
        self.tree = search.tree
        self.store = search.store
        self.bus = search.bus

    def send(self, cmd: EngineCommand) -> None:
        """Apply a command now; it is recorded in the store (applied) so the run's history shows it."""
        command_id = self.store.record_command(cmd)
        self._apply(cmd)
        self.store.mark_applied(command_id)

    def poll(self) -> None:
        """Apply the commands other processes recorded since the last poll; a row that does not read as a
        command (bad JSON, an unknown kind) is marked applied with a warning in the log."""
        for command_id, cmd in self.store.pending_commands():
            if isinstance(cmd, UnreadableRow):
                self.bus.emit(cmd.log_line())
            else:
                self._apply(cmd)
            self.store.mark_applied(command_id)

    def _apply(self, cmd: Command) -> None:
        self.apply(cmd)
        self.search.wake.set()

    def _known(self, node_id: int) -> bool:
        if node_id in self.tree:
            return True
        self.bus.log(f"no node {node_id} in this run: command ignored", "warning")
        return False

    @singledispatchmethod
    def apply(self, cmd: Command) -> None:
        """What the command changes (one handler per type, below)."""
        self.bus.log(f"command {type(cmd).__name__} is not one this search knows: ignored", "warning")

    @apply.register
    def _pause(self, cmd: Pause) -> None:
        self.search.pause()

    @apply.register
    def _resume(self, cmd: Resume) -> None:
        self.search.resume()

    @apply.register
    def _stop(self, cmd: Stop) -> None:
        self.search.profiles.dropped = True  # the profiles still queued are dropped
        self.search.stop("stopped by request")

    @apply.register
    def _expand(self, cmd: ExpandNode) -> None:
        if not self._known(cmd.node_id):
            return
        if self.tree.may_expand(cmd.node_id):
            self.search.forced.append(cmd.node_id)
            self.bus.log(f"node {cmd.node_id} will be expanded next", node_id=cmd.node_id)
        else:
            status = self.tree[cmd.node_id].status
            self.bus.log(
                f"node {cmd.node_id} cannot be expanded ({status}, or banned, or exhausted)", "warning", cmd.node_id
            )

    @apply.register
    def _hint(self, cmd: AddHint) -> None:
        if not self._known(cmd.node_id):
            return
        node = self.tree[cmd.node_id]
        node.hints.append(cmd.text)
        self.store.set_hints(cmd.node_id, node.hints)
        understood = hint_feedback(self.search.proposer, self.search.card.spec, cmd.text)
        self.bus.log(f"hint for node {cmd.node_id} ({cmd.text!r}): {understood}", node_id=cmd.node_id)

    @apply.register
    def _inject(self, cmd: InjectKernel) -> None:
        if not self._known(cmd.parent_id):
            return
        if self.search.stop_reason is not None:
            self.bus.log("the search is stopping: injected kernel not added", "warning", cmd.parent_id)
            return
        proposal = Proposal(source=cmd.source, plan=cmd.plan, mutation=cmd.note, proposer="hand")
        self.search.pipeline.submit(cmd.parent_id, proposal, Priority.STEERED, allow_duplicate=True)

    @apply.register
    def _ban(self, cmd: BanSubtree) -> None:
        if self._known(cmd.node_id):
            self.tree.ban(cmd.node_id, cmd.banned)
            self.bus.emit(NodeChanged(node=self.store.set_banned(cmd.node_id, cmd.banned)))

    @apply.register
    def _pin(self, cmd: PinSubtree) -> None:
        """A pin that cannot steer anywhere is refused with the reason; one under a pruned node reopens the path."""
        if not self._known(cmd.node_id):
            return
        problem = self.tree.pin_problem(cmd.node_id) if cmd.pinned else None
        if problem is not None:
            self.bus.log(f"pin of node {cmd.node_id} refused: {problem}", "warning", cmd.node_id)
            return
        reopened = self.tree.pin(cmd.node_id, cmd.pinned)
        self.bus.emit(NodeChanged(node=self.store.set_pinned(cmd.node_id, cmd.pinned)))
        if not cmd.pinned:
            self.bus.log(f"unpinned node {cmd.node_id}", node_id=cmd.node_id)
            return
        text = f"pinned node {cmd.node_id}: the search stays inside its subtree"
        if reopened:
            ids = ", ".join(f"#{i}" for i in reopened)
            text += f"; the pruned nodes on the way there are open again ({ids})"
        self.bus.log(text, node_id=cmd.node_id)

    @apply.register
    def _profile(self, cmd: ProfileNode) -> None:
        if not self._known(cmd.node_id):
            return
        node = self.tree[cmd.node_id]
        if not node.measured:
            self.bus.log(
                f"node {cmd.node_id} is {node.status}: only a measured node can be profiled", "warning", cmd.node_id
            )
        elif self.search.profiles.request(cmd.node_id, ProfileReason.ASKED):
            self.bus.log(f"node {cmd.node_id} will be profiled next", node_id=cmd.node_id)

    @apply.register
    def _export(self, cmd: MarkExport) -> None:
        if self._known(cmd.node_id):
            self.bus.emit(NodeChanged(node=self.store.set_export(cmd.node_id, cmd.export)))
