"""What Nsight Compute measured on a kernel and what it means: typed metrics, the bottleneck class, the roofline.

`NodeProfile` is what is saved on a node; the search's reward, the TUI's metrics pane and the CLI read it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.plan import ResolvedLaunch
from kernelforge_tui.vocabulary.evaluation import PtxasStats

Unit = Literal["percent", "bytes", "bytes/second", "seconds", "cycles", "hertz", "ratio", "count"]
"""Canonical units: values are converted to these (Kbyte -> bytes, usecond -> seconds, Ghz -> hertz)."""

Bottleneck = Literal["compute", "memory_bandwidth", "memory_latency"]

CLASS_NAMES: dict[Bottleneck, str] = {
    "compute": "compute-bound",
    "memory_bandwidth": "memory-bandwidth-bound",
    "memory_latency": "memory-latency-bound",
}


def format_value(value: float, unit: str) -> str:
    if unit == "percent":
        return f"{value:.1f}%"
    if unit == "bytes":
        return f"{value / 1e6:.1f} MB"
    if unit == "bytes/second":
        return f"{value / 1e9:.0f} GB/s"
    if unit == "seconds":
        return f"{value * 1e6:.1f} us"
    return f"{value:.3g}" + (f" {unit}" if unit and unit not in ("count", "ratio") else "")


class Metric(BaseModel):
    """One measured value, in a canonical unit."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The raw metric name (raw page) or the section's label (details page)."""
    section: str
    value: float
    unit: Unit
    raw_unit: str = ""
    """The unit as ncu printed it, before conversion."""


class ProfileReport(BaseModel):
    """What ncu measured on one launch of one kernel."""

    kernel: str
    metrics: dict[str, Metric]
    launch: ResolvedLaunch | None = None
    ncu_version: str = ""
    command: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    """Wall time of the ncu run: the cost of profiling this candidate."""
    warnings: list[str] = Field(default_factory=list)

    def value(self, name: str) -> float | None:
        """A metric's value in its canonical unit, or None where ncu did not report it."""
        metric = self.metrics.get(name)
        return metric.value if metric is not None else None

    def values(self) -> dict[str, float]:
        """name -> value: what the reward and the classifier read."""
        return {name: m.value for name, m in self.metrics.items()}


class KeyMetric(BaseModel):
    """One number worth showing for the kernel's class, with what it means."""

    label: str
    value: float
    unit: str
    note: str = ""

    def value_text(self) -> str:
        return format_value(self.value, self.unit)

    def text(self) -> str:
        return f"{self.label} {self.value_text()}" + (f" ({self.note})" if self.note else "")


class Roofline(BaseModel):
    """Where the kernel sits against the measured ceilings, from the card's counted FLOPs and bytes."""

    flops: int
    bytes: int
    seconds: float
    """The time the rates are computed from (the worker's median where known, else ncu's duration)."""
    time_source: Literal["measured", "ncu"]
    arithmetic_intensity: float
    """Counted FLOPs per counted byte."""
    ridge_point: float
    """FLOPs per byte where the copy ceiling meets the compute ceiling (the FMA rate, or the tensor-core rate for a
    card with a bf16 or fp16 input: `Ceilings.compute_tflops`): below it the memory side bounds."""
    achieved_gbps: float
    achieved_tflops: float
    attainable_tflops: float
    """min(compute ceiling, intensity x copy ceiling)."""
    bound: Literal["memory", "compute"]
    share_of_attainable: float
    """Achieved over attainable on the bounding side (1.0 = on the roof)."""


class HardwareReport(BaseModel):
    """The bottleneck class of one profiled kernel, the metrics that matter for it, and its roofline position."""

    kernel: str
    bottleneck: Bottleneck
    sm_pct: float
    memory_pct: float
    threshold_pct: float
    reason: str
    key_metrics: list[KeyMetric]
    stalls: list[KeyMetric] = Field(default_factory=list)
    """Top stall reasons (cycles per issued instruction), for latency-bound kernels and any with stalls."""
    roofline: Roofline | None = None

    @property
    def class_name(self) -> str:
        return CLASS_NAMES[self.bottleneck]

    def summary(self) -> str:
        """One line: class, the two headlines, the most telling metric, the roofline share."""
        parts = [f"{self.class_name}: SM {self.sm_pct:.0f}%, memory {self.memory_pct:.0f}% of peak"]
        if self.key_metrics:
            parts.append(self.key_metrics[0].text())
        if self.bottleneck == "memory_latency" and self.stalls:
            parts.append(f"top stall {self.stalls[0].label}")
        if self.roofline is not None:
            r = self.roofline
            parts.append(f"{r.share_of_attainable:.0%} of the {r.bound} roof")
        return "; ".join(parts)

    def lines(self) -> list[str]:
        """The full report as text lines (the CLI and the agents' prompt use them)."""
        out = [f"{self.kernel}: {self.class_name}", f"  why: {self.reason}"]
        out += [f"  {m.text()}" for m in self.key_metrics]
        if self.stalls:
            out.append("  stalls (cycles per issued instruction): " + ", ".join(m.text() for m in self.stalls))
        if self.roofline is not None:
            r = self.roofline
            out.append(
                f"  roofline: {r.arithmetic_intensity:.3g} FLOP/B (ridge {r.ridge_point:.3g}), "
                f"{r.achieved_gbps:.0f} GB/s, {r.achieved_tflops:.3g} TFLOP/s, attainable {r.attainable_tflops:.3g} "
                f"TFLOP/s: {r.share_of_attainable:.0%} of the {r.bound} roof ({r.time_source} time)"
            )
        return out


class NodeProfile(BaseModel):
    """What is saved on a node (`RunStore.save_profile`): ncu's metrics, the classified report, ptxas stats."""

    profile: ProfileReport
    hardware: HardwareReport
    ptxas: PtxasStats | None = None
