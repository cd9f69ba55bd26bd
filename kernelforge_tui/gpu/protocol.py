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

FailureKind = Literal["compile", "launch", "mismatch", "timeout", "cheat", "worker"]
"""Why a candidate did not count: the kinds the search and the TUI show."""


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


class Crash(Message):
    """Test hook: make the worker die as a faulting kernel would (exit without a reply)."""

    op: Literal["crash"] = "crash"


Request = Annotated[LoadCard | Evaluate | MeasureCeilings | Crash, Field(discriminator="op")]


class RequestEnvelope(Message):
    request: Request


class SetCheck(Message):
    """The outcome of one input set: each output compared with its reference."""

    name: str
    ok: bool
    reason: str = ""
    bad: int = 0
    unwritten: int = 0
    numel: int = 0
    max_abs_error: float = 0.0
    max_error_ratio: float = 0.0
    """Largest |out - ref| / (atol + rtol |ref|): under 1 passes."""
    first_bad_index: int | None = None


class Timing(Message):
    """Event-timed launches with the L2 flushed before each."""

    median_us: float
    p10_us: float
    p90_us: float
    cv: float
    """Robust coefficient of variation: IQR / 1.349 / median."""
    reps: int


class EvalResult(Message):
    """Everything the worker learned about one candidate."""

    ok: bool
    failure: FailureKind | None = None
    reason: str = ""
    checks: list[SetCheck] = Field(default_factory=list)
    deterministic: bool | None = None
    candidate: Timing | None = None
    baseline: Timing | None = None
    speedup: float | None = None
    """Baseline median over candidate median, measured side by side in this worker."""
    achieved_gbps: float | None = None
    achieved_tflops: float | None = None
    gpu_seconds: float = 0.0
    fatal: bool = False
    """The worker's state can no longer be trusted (a fault, a stray write): it exits after replying."""


class CardLoaded(Message):
    sets: list[str]
    device_bytes: int
    seconds: float


class Ceilings(Message):
    """The physical limits every speedup is held against, measured on this GPU."""

    gpu_name: str
    copy_gbps: float
    """Device-to-device copy, bytes read plus written, per second (1e9)."""
    fma_tflops: float
    """FP32 FMA rate, 2 FLOPs per FMA (1e12 per second)."""
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int


class WorkerFailure(Message):
    """The request could not be carried out (a bad card, a CUDA error outside any candidate)."""

    error: str


class ReplyEnvelope(Message):
    reply: EvalResult | CardLoaded | Ceilings | WorkerFailure
    kind: Literal["eval", "card", "ceilings", "failure"]
