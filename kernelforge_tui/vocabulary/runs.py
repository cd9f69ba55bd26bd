"""A run at a glance: for `kernelforge runs`, the TUI's header and the end of `optimize`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from kernelforge_tui.vocabulary.events import LogLine


class RunInfo(BaseModel):
    """One run at a glance: for `kernelforge runs`, the TUI's header and the end of `optimize`."""

    run_id: str
    run_dir: Path
    card_name: str
    family: str
    gpu_name: str
    backend: str
    """"gpu", or "simulated" (no GPU ran anything: the timings are invented)."""
    state: str
    """starting, running, paused, stopping, finished, or interrupted (the process died mid-run)."""
    reason: str = ""
    started_at: float
    ended_at: float | None = None
    best_node_id: int | None = None
    best_speedup: float | None = None
    best_speedup_interval: tuple[float, float] | None = None
    best_latency_us: float | None = None
    best_ceiling_share: float | None = None
    node_count: int = 0
    failure_count: int = 0
    in_flight_count: int = 0
    active_seconds: float = 0.0
    gpu_seconds: float = 0.0


class SkippedRun(BaseModel):
    """A run directory `kernelforge runs` could not read (an empty or damaged store): listed as a note."""

    run_dir: Path
    reason: str


class RunListing(BaseModel):
    """The runs under a root, newest first, and the directories that could not be read."""

    runs: list[RunInfo]
    skipped: list[SkippedRun]


class UnreadableRow(BaseModel):
    """A stored event or command that no longer parses (a damaged or hand-edited row): returned in its place so
    that one bad row is skipped with a log line instead of ending a view or a search."""

    table: Literal["events", "commands"]
    row_id: int
    kind: str
    error: str

    def log_line(self) -> LogLine:
        return LogLine(level="warning", text=f"{self.table} row {self.row_id} ({self.kind}) skipped: {self.error}")


class WorkerStatus(BaseModel):
    """One worker of a Dask cluster as a search's coordinator sees it."""

    address: str
    host: str
    gpus: int
    """GPU resources it offers (0: a CPU worker, for builds)."""
    running: list[str] = Field(default_factory=list)
    """What its GPUs work on now: `card #node` per evaluation or profile in flight."""
    evaluations: int = 0
    """Evaluations it finished for this process."""
    set_aside: str | None = None
    """Why this process gives its GPUs no more work (its tasks kept raising), None while it is in use."""


class ClusterStatus(BaseModel):
    """A cluster at a glance, for the views: its workers, what each GPU is on, and the throughput."""

    address: str
    workers: list[WorkerStatus]
    evaluations_per_minute: float
    """Evaluations finished per minute since this process connected."""

    @property
    def gpus(self) -> int:
        """The GPUs in use (a worker set aside offers its GPUs to nobody here)."""
        return sum(w.gpus for w in self.workers if w.set_aside is None)
