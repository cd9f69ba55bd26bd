"""Messages between the evaluation client and the GPU worker subprocess: one JSON object per line.

The worker runs untrusted kernels; everything that crosses the pipe is a pydantic model, so a worker
that dies mid-message or prints garbage is seen as a failed worker, never as a result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.plan import ResolvedLaunch
from kernelforge_tui.config import EvalSettings
from kernelforge_tui.vocabulary.evaluation import Ceilings, EvalResult


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KernelRef(Message):
    """A built kernel and how to launch it for the loaded card."""

    cubin: Path
    launch: ResolvedLaunch


class LoadCard(Message):
    """Prepare a card on the GPU: input sets (stored, seeded and fresh), references, guarded buffers."""

    op: Literal["load_card"] = "load_card"
    card_dir: Path
    helpers_cubin: Path
    settings: EvalSettings
    fresh_seed: int
    """Base seed of the fresh input sets; drawn anew for each worker so no kernel can know them."""
    baseline: KernelRef | None = None
    """Needed when the card's reference for fresh inputs is its baseline kernel."""


class Evaluate(Message):
    """Prove one candidate correct on every set, then time it against the baseline, interleaved."""

    op: Literal["evaluate"] = "evaluate"
    candidate: KernelRef
    baseline: KernelRef | None
    time_it: bool = True
    bytes_moved: int = 0
    flops: int = 0


class MeasureCeilings(Message):
    op: Literal["measure_ceilings"] = "measure_ceilings"
    helpers_cubin: Path


Request = Annotated[LoadCard | Evaluate | MeasureCeilings, Field(discriminator="op")]


class RequestEnvelope(Message):
    request: Request


class CardLoaded(Message):
    sets: list[str]
    device_bytes: int
    seconds: float


class WorkerFailure(Message):
    """The request could not be carried out (a bad card, a CUDA error outside any candidate)."""

    error: str


class ReplyEnvelope(Message):
    reply: EvalResult | CardLoaded | Ceilings | WorkerFailure
    kind: Literal["eval", "card", "ceilings", "failure"]
