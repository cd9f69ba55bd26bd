"""Typed messages the app posts: what it sent to the engine and what a batch of events changed."""

from __future__ import annotations

from textual.message import Message

from kernelforge_tui.models.commands import EngineCommand
from kernelforge_tui.tui.state import Changes


class CommandSent(Message):
    """A steering command went to the engine (through the run source)."""

    def __init__(self, command: EngineCommand) -> None:
        super().__init__()
        self.command = command


class RunUpdated(Message):
    """A batch of engine events was folded into the run state; only one pending update is kept."""

    def __init__(self, changes: Changes) -> None:
        super().__init__()
        self.changes = changes

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunUpdated)


class EngineFinished(Message):
    """The in-process search returned (or failed: `error`)."""

    def __init__(self, error: str = "") -> None:
        super().__init__()
        self.error = error
