"""A run at a glance: for `kernelforge runs`, the TUI's header and the end of `optimize`."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel


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
    best_latency_us: float | None = None
    best_ceiling_share: float | None = None
    node_count: int = 0
    failure_count: int = 0
    in_flight_count: int = 0
    active_seconds: float = 0.0
    gpu_seconds: float = 0.0
