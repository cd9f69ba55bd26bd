"""Typed commands a search accepts (pause, resume, expand, hint, inject, ban, pin, profile, export, stop).

A view steers a search only through these; each is also written to the run's store, so a view in another
process steers a live run by recording commands the search polls.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import Field

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.vocabulary.nodes import Frozen


class Command(Frozen):
    at: float = Field(default_factory=time.time)


class Pause(Command):
    kind: Literal["pause"] = "pause"


class Resume(Command):
    kind: Literal["resume"] = "resume"


class Stop(Command):
    kind: Literal["stop"] = "stop"


class ExpandNode(Command):
    """Propose children of this node next, ahead of what selection would pick."""

    kind: Literal["expand"] = "expand"
    node_id: int


class AddHint(Command):
    """Free text handed to the proposer for this node's next children."""

    kind: Literal["hint"] = "hint"
    node_id: int
    text: str


class InjectKernel(Command):
    """A hand-written kernel, evaluated as a child of this node like any proposal."""

    kind: Literal["inject"] = "inject"
    parent_id: int
    source: str
    plan: LaunchPlan
    note: str = "hand-written"


class BanSubtree(Command):
    """Never select in this subtree again (until unbanned)."""

    kind: Literal["ban"] = "ban"
    node_id: int
    banned: bool = True


class PinSubtree(Command):
    """Select only in this subtree while pinned."""

    kind: Literal["pin"] = "pin"
    node_id: int
    pinned: bool = True


class ProfileNode(Command):
    """Profile this node with Nsight Compute now (queued ahead of the automatic profiles)."""

    kind: Literal["profile"] = "profile"
    node_id: int


class MarkExport(Command):
    kind: Literal["export"] = "export"
    node_id: int
    export: bool = True


EngineCommand = Annotated[
    Pause | Resume | Stop | ExpandNode | AddHint | InjectKernel | BanSubtree | PinSubtree | MarkExport | ProfileNode,
    Field(discriminator="kind"),
]
