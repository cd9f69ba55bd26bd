"""What building and evaluating one candidate produced: build diagnostics, set checks, timings, the verdict.

These cross process boundaries (the GPU worker's pipe) and are stored with every measurement, so they
are strict pydantic models: a message that does not fit is an error, never a silently wrong result.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.config import MAX_DIAGNOSTICS, MAX_LOG_BYTES
from kernelforge_tui.vocabulary.nodes import FailureKind

SOURCE_NAME = "candidate.cu"
"""The name the candidate's source has in the build directory and in every diagnostic."""

BuildFailure = Literal["compile error", "source check", "timeout", "killed", "sandbox", "nvcc missing"]

MAX_DIAGNOSTIC_CHARS = 2000
"""A diagnostic's message and its source line are each cut to this many characters (a line may be a MiB)."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SetCheck(Strict):
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


class Timing(Strict):
    """Event-timed launches with the L2 flushed before each."""

    median_us: float
    p10_us: float
    p90_us: float
    cv: float
    """Robust coefficient of variation: IQR / 1.349 / median."""
    reps: int
    samples_us: list[float] = Field(default_factory=list)
    """Every timed launch in order; candidate and baseline sample i ran side by side (interleaved)."""


class EvalResult(Strict):
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
    speedup_interval: tuple[float, float] | None = None
    """95% bootstrap interval of the speedup over the paired interleaved samples (None without samples)."""
    achieved_gbps: float | None = None
    achieved_tflops: float | None = None
    gpu_seconds: float = 0.0
    fatal: bool = False
    """The worker's state can no longer be trusted (a fault, a stray write): it exits after replying."""


TENSOR_PER_FMA: dict[tuple[int, int], float] = {
    (7, 0): 8.0,  # V100: 125 TFLOP/s fp16 tensor, 15.7 fp32
    (7, 5): 8.0,  # T4: 65 and 8.1
    (8, 0): 16.0,  # A100: 312 bf16 dense, 19.5 fp32
    (8, 6): 4.0,  # A10: 125 and 31.2
    (8, 9): 4.0,  # L40S: 362 and 91.6
    (9, 0): 16.0,  # H100, H200: 989 bf16 dense, 67 fp32 (the same clock: 4096 and 256 FLOPs an SM a cycle)
}
"""Dense 16-bit (bf16, fp16) tensor-core FLOPs per FP32 FMA-unit FLOP, from NVIDIA's published peaks, by compute
capability. An architecture not listed gets the largest ratio (32: Blackwell's B200 is about 2250 against 75), so
that a tensor-core kernel is never taken for one that skips work."""
UNLISTED_TENSOR_PER_FMA = 32.0
TENSOR_DTYPES = frozenset({"bfloat16", "float16"})
"""Input dtypes a kernel may multiply on tensor cores."""


class Ceilings(Strict):
    """The physical limits every speedup is held against, measured on this GPU."""

    gpu_name: str
    copy_gbps: float
    """Device-to-device copy, bytes read plus written, per second (1e9)."""
    fma_tflops: float
    """FP32 FMA rate, 2 FLOPs per FMA (1e12 per second)."""
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    shared_per_sm_bytes: int | None = None
    """Shared memory one SM holds (the blocks resident on it share it). None: measured before it was recorded."""
    shared_per_block_bytes: int | None = None
    """The most shared memory one block may have (opted in: the worker raises a kernel's limit past 48 KiB)."""
    registers_per_sm: int | None = None
    """32-bit registers one SM holds."""
    threads_per_sm: int | None = None
    """Threads resident on one SM at most."""

    def compute_tflops(self, dtypes: Iterable[str]) -> float:
        """The FLOP rate a card with inputs of these dtypes is held against: with a bf16 or fp16 input the dense
        tensor-core rate (the measured FMA rate times TENSOR_PER_FMA: derived, since the worker times no tensor-core
        kernel of its own), else the measured FP32 FMA rate. On the H200 a tensor-core matmul ran at 5.4x the FMA
        rate and, held to that, was refused as a cheat."""
        if TENSOR_DTYPES.isdisjoint(dtypes):
            return self.fma_tflops
        return self.fma_tflops * TENSOR_PER_FMA.get(self.capability, UNLISTED_TENSOR_PER_FMA)


class PtxasStats(BaseModel):
    """Resource use of one kernel as ptxas reports it (`-Xptxas -v`)."""

    registers: int = 0
    barriers: int = 0
    shared_bytes: int = 0
    """Static shared memory; dynamic shared memory comes from the launch plan."""
    constant_bytes: int = 0
    """Constant banks on the kernel's line; ptxas 13 no longer prints cmem[0] for sm_90 and newer."""
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0


class Diagnostic(BaseModel):
    """One compiler message, placed in the candidate source where the compiler says."""

    file: str = SOURCE_NAME
    """`candidate.cu`, a header path, or the tool (`ptxas`, `nvcc`) for messages with no place."""
    line: int | None = None
    column: int | None = None
    severity: Literal["error", "warning"]
    message: str
    source_line: str | None = None


class BuildResult(BaseModel):
    """What one build produced; the same model is the cache entry's metadata."""

    ok: bool
    cubin_path: Path | None = None
    key: str
    cached: bool = False
    seconds: float = 0.0
    """Wall time of this call (a cache hit is fast)."""
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    ptxas: dict[str, PtxasStats] = Field(default_factory=dict)
    """Entry-function (kernel) name to its resource use."""
    log: str = ""
    failure: BuildFailure | None = None

    def bounded(self, max_log_bytes: int = MAX_LOG_BYTES, max_diagnostics: int = MAX_DIAGNOSTICS) -> BuildResult:
        """This result cut to a size that may be cached, stored and replayed: the log's head, the first diagnostics
        with their texts cut, and a line saying what was dropped. Why: compiler output grows with what the source
        asks for (one warning per copy of a statement, each echoing a long line)."""
        log, diagnostics = self.log, self.diagnostics
        if len(log) > max_log_bytes or len(log.encode("utf-8")) > max_log_bytes:
            head = log.encode("utf-8")[:max_log_bytes].decode("utf-8", "ignore")
            head = head[: head.rfind("\n") + 1] or head
            log = f"{head}kernelforge: {len(log) - len(head)} more characters of the log dropped\n"
        clipped = [
            d.model_copy(update={"message": _clip(d.message), "source_line": _clip(d.source_line)})
            if len(d.message) > MAX_DIAGNOSTIC_CHARS or len(d.source_line or "") > MAX_DIAGNOSTIC_CHARS
            else d
            for d in diagnostics[:max_diagnostics]
        ]
        if len(diagnostics) > max_diagnostics:
            dropped = len(diagnostics) - max_diagnostics
            clipped.append(Diagnostic(file="nvcc", severity="warning", message=f"{dropped} more diagnostics dropped"))
        if log is self.log and clipped == diagnostics:
            return self
        return self.model_copy(update={"log": log, "diagnostics": clipped})


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_DIAGNOSTIC_CHARS:
        return text
    return f"{text[:MAX_DIAGNOSTIC_CHARS]}... ({len(text) - MAX_DIAGNOSTIC_CHARS} more characters)"


class Evaluation(BaseModel):
    """One candidate's whole verdict: its build, its checks, its timing, and its share of the ceiling."""

    ok: bool
    failure: FailureKind | None = None
    reason: str = ""
    build: BuildResult | None = None
    result: EvalResult | None = None
    ceiling_share: float | None = None
    """The larger of achieved bandwidth over the copy ceiling and achieved FLOP rate over the FMA ceiling."""
    measured_on: str | None = None
    """The machine and GPU that proved and timed it (`host GPU 1 NVIDIA H200`): a run on several GPUs, or a
    cluster of mixed ones, says which GPU measured what (each against the baseline on that same GPU)."""

    @property
    def speedup(self) -> float | None:
        return self.result.speedup if self.result else None


def speedup_text(speedup: float, interval: tuple[float, float] | None, digits: int = 2) -> str:
    """A speedup as every view shows it: with its 95% interval where one was measured."""
    text = f"{speedup:.{digits}f}x"
    if interval is not None:
        text += f" (95%: {interval[0]:.{digits}f}-{interval[1]:.{digits}f})"
    return text


def ceiling_share_text(share: float, simulated: bool) -> str:
    """The share of the ceiling in words, the same in `show`, summary.md, the TUI and the agents' prompts; a
    simulated run measured no ceiling and says so."""
    if simulated:
        return f"{share:.0%} of a simulated ceiling (no GPU measured it)"
    return f"{share:.0%} of the measured ceiling"
