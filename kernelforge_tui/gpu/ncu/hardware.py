"""What limits a kernel: its bottleneck class, the few metrics that matter for that class, its roofline position.

The rule follows the expert workflow this tool imitates (CUDAMaster's hardware-analysis filter, in the
Kernel Forge seed notes under shared/seeds/): compare the two Speed-Of-Light headlines of Nsight Compute,
SM throughput and memory throughput, each in % of its sustained peak. When neither reaches the threshold
(about 30%, a cut the authors derived with Otsu's method over their profiles) the kernel keeps neither
the SMs nor the memory system busy: it waits, so it is memory-latency-bound (too few loads in flight, a
dependent chain, a small grid). Otherwise the larger of the two names the class. Passing on only the
class's own metrics keeps an analyst (person or LLM) on what can move the kernel.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kernelforge_tui.config import ClassifierSettings as ClassifierSettings
from kernelforge_tui.vocabulary.evaluation import Ceilings
from kernelforge_tui.vocabulary.profiles import Bottleneck, HardwareReport, KeyMetric, ProfileReport, Roofline

SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY_THROUGHPUT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_THROUGHPUT = (
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
)
DURATION = "gpu__time_duration.sum"
DRAM_BYTES = "dram__bytes.sum"
L2_HIT = "lts__t_sector_hit_rate.pct"
L1_HIT = "l1tex__t_sector_hit_rate.pct"
LD_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
LD_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
ST_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
ST_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
ELIGIBLE_WARPS = "smsp__warps_eligible.avg.per_cycle_active"
ISSUE_ACTIVE = "smsp__issue_active.avg.pct_of_peak_sustained_active"
WAVES = "launch__waves_per_multiprocessor"
REGISTERS = "launch__registers_per_thread"
INSTRUCTIONS = "smsp__inst_executed.sum"
IPC = "sm__inst_executed.avg.per_cycle_active"
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
PIPE = re.compile(r"^sm__(?:inst_executed_pipe_(\w+)|pipe_(\w+)_cycles_active)\.avg\.pct_of_peak_sustained_active$")
MIX = {
    "FFMA": "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "FADD": "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "FMUL": "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
}
SECTOR_BYTES = 32


def classify(sm_pct: float, memory_pct: float, threshold_pct: float = 30.0) -> tuple[Bottleneck, str]:
    """The class and the reason in words, from the two Speed-Of-Light headlines (% of peak)."""
    if sm_pct < threshold_pct and memory_pct < threshold_pct:
        return "memory_latency", (
            f"neither SM ({sm_pct:.0f}%) nor memory ({memory_pct:.0f}%) throughput reaches {threshold_pct:.0f}% of "
            "peak: the kernel waits on latency (too little work in flight)"
        )
    if memory_pct >= sm_pct:
        return "memory_bandwidth", f"memory throughput {memory_pct:.0f}% of peak is the larger (SM {sm_pct:.0f}%)"
    return "compute", f"SM throughput {sm_pct:.0f}% of peak is the larger (memory {memory_pct:.0f}%)"


def _first(values: Mapping[str, float], *names: str) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


def stall_reasons(values: Mapping[str, float], top: int = 3) -> list[KeyMetric]:
    """The largest stall reasons, in cycles per issued instruction ('selected' is issuing, not a stall)."""
    found: list[tuple[str, float]] = []
    for name, value in values.items():
        match = STALL.match(name)
        if match and not match.group(1).endswith("not_issued") and match.group(1) != "selected":
            found.append((match.group(1), value))
    found.sort(key=lambda item: -item[1])
    return [KeyMetric(label=reason, value=value, unit="ratio") for reason, value in found[:top] if value > 0]


def _bandwidth_metrics(values: Mapping[str, float], counted_bytes: int, seconds: float | None) -> list[KeyMetric]:
    out: list[KeyMetric] = []
    dram_pct = _first(values, *DRAM_THROUGHPUT)
    if dram_pct is not None:
        out.append(KeyMetric(label="DRAM throughput", value=dram_pct, unit="percent", note="of peak"))
    dram_bytes = values.get(DRAM_BYTES)
    if dram_bytes is not None:
        note = f"{dram_bytes / counted_bytes:.2f}x the card's counted bytes" if counted_bytes else ""
        out.append(KeyMetric(label="DRAM bytes", value=dram_bytes, unit="bytes", note=note))
        if seconds:
            out.append(KeyMetric(label="DRAM bandwidth", value=dram_bytes / seconds, unit="bytes/second"))
    for label, sectors, requests in (("load", LD_SECTORS, LD_REQUESTS), ("store", ST_SECTORS, ST_REQUESTS)):
        if values.get(requests):
            per_request = values[sectors] / values[requests]
            out.append(
                KeyMetric(
                    label=f"global {label} bytes per request",
                    value=per_request * SECTOR_BYTES,
                    unit="count",
                    note=f"{per_request:.1f} sectors/request; 4: coalesced 4-byte, 32: scattered",
                )
            )
    l2 = values.get(L2_HIT)
    if l2 is not None:
        out.append(KeyMetric(label="L2 hit rate", value=l2, unit="percent"))
    return out


def _latency_metrics(values: Mapping[str, float]) -> list[KeyMetric]:
    out: list[KeyMetric] = []
    achieved = values.get(ACHIEVED_OCCUPANCY)
    if achieved is not None:
        theoretical = values.get(THEORETICAL_OCCUPANCY)
        note = f"theoretical {theoretical:.0f}%" if theoretical is not None else ""
        out.append(KeyMetric(label="achieved occupancy", value=achieved, unit="percent", note=note))
    eligible = values.get(ELIGIBLE_WARPS)
    if eligible is not None:
        out.append(
            KeyMetric(
                label="eligible warps per cycle", value=eligible, unit="ratio", note="per scheduler; < 1 idles it"
            )
        )
    issue = values.get(ISSUE_ACTIVE)
    if issue is not None:
        out.append(KeyMetric(label="issue slots busy", value=issue, unit="percent"))
    waves = values.get(WAVES)
    if waves is not None:
        out.append(
            KeyMetric(label="waves per SM", value=waves, unit="ratio", note="< 1: the grid does not fill the GPU")
        )
    return out


def _compute_metrics(values: Mapping[str, float]) -> list[KeyMetric]:
    out: list[KeyMetric] = []
    pipes: list[tuple[str, float]] = []
    for name, value in values.items():
        match = PIPE.match(name)
        if match:
            pipes.append((match.group(1) or match.group(2), value))
    pipes.sort(key=lambda item: -item[1])
    seen: set[str] = set()
    for pipe, value in pipes:
        if pipe not in seen and len(seen) < 3:
            seen.add(pipe)
            out.append(KeyMetric(label=f"{pipe} pipe", value=value, unit="percent", note="of peak"))
    issue = values.get(ISSUE_ACTIVE)
    if issue is not None:
        out.append(KeyMetric(label="issue slots busy", value=issue, unit="percent"))
    ipc = values.get(IPC)
    if ipc is not None:
        out.append(KeyMetric(label="IPC", value=ipc, unit="ratio", note="instructions per cycle per SM, 4 at most"))
    total = values.get(INSTRUCTIONS)
    if total is not None:
        out.append(KeyMetric(label="warp instructions", value=total, unit="count"))
    mix = {label: values[name] for label, name in MIX.items() if values.get(name)}
    if mix:
        all_fp = sum(mix.values())
        text = ", ".join(f"{label} {count / all_fp:.0%}" for label, count in mix.items())
        out.append(KeyMetric(label="fp32 thread instructions", value=all_fp, unit="count", note=text))
    return out


@dataclass(frozen=True)
class RooflineFloor:
    """The least time a card's counted work can take on this GPU: its bytes at the measured copy ceiling or its
    FLOPs at the compute ceiling its dtypes are held to, whichever is longer. A launch faster than this skipped
    work: no kernel moves bytes faster than the memory does, or computes faster than the units do."""

    seconds: float
    bound: Literal["memory", "compute"]
    limit: str
    """What sets it, in words: `100.7 MB at the measured copy ceiling of 4250 GB/s`."""


def roofline_floor(flops: int, counted_bytes: int, ceilings: Ceilings, dtypes: Sequence[str] = ()) -> RooflineFloor:
    """The roofline floor of a card's counted work (`dtypes`: its inputs', which pick the compute roof)."""
    copy_s = counted_bytes / (ceilings.copy_gbps * 1e9)
    compute_tflops = ceilings.compute_tflops(dtypes)
    compute_s = flops / (compute_tflops * 1e12)
    if copy_s >= compute_s:
        limit = f"{counted_bytes / 1e6:.4g} MB at the measured copy ceiling of {ceilings.copy_gbps:.0f} GB/s"
        return RooflineFloor(seconds=copy_s, bound="memory", limit=limit)
    limit = f"{flops / 1e9:.4g} GFLOP at the compute ceiling of {compute_tflops:.0f} TFLOP/s"
    return RooflineFloor(seconds=compute_s, bound="compute", limit=limit)


def roofline(
    flops: int,
    counted_bytes: int,
    seconds: float,
    ceilings: Ceilings,
    time_source: Literal["measured", "ncu"],
    dtypes: Sequence[str] = (),
) -> Roofline:
    """The roofline position from counted work, a time, and the ceilings (the compute roof is the one the card's
    input `dtypes` are held to: `Ceilings.compute_tflops`)."""
    copy_bps = ceilings.copy_gbps * 1e9
    fma_fps = ceilings.compute_tflops(dtypes) * 1e12
    intensity = flops / counted_bytes if counted_bytes else float("inf")
    ridge = fma_fps / copy_bps
    attainable = min(fma_fps, intensity * copy_bps) if counted_bytes else fma_fps
    achieved_bps = counted_bytes / seconds
    achieved_fps = flops / seconds
    bound: Literal["memory", "compute"] = "memory" if intensity < ridge else "compute"
    share = achieved_bps / copy_bps if bound == "memory" else achieved_fps / fma_fps
    return Roofline(
        flops=flops,
        bytes=counted_bytes,
        seconds=seconds,
        time_source=time_source,
        arithmetic_intensity=intensity,
        ridge_point=ridge,
        achieved_gbps=achieved_bps / 1e9,
        achieved_tflops=achieved_fps / 1e12,
        attainable_tflops=attainable / 1e12,
        bound=bound,
        share_of_attainable=share,
    )


def analyse(
    report: ProfileReport | Mapping[str, float],
    *,
    kernel: str = "",
    flops: int = 0,
    counted_bytes: int = 0,
    measured_us: float | None = None,
    ceilings: Ceilings | None = None,
    settings: ClassifierSettings | None = None,
    dtypes: Sequence[str] = (),
) -> HardwareReport:
    """Classify a profile and keep the metrics that matter for its class; the roofline where ceilings are known
    (`dtypes`: the card's inputs', which pick its compute roof)."""
    settings = settings or ClassifierSettings()
    if isinstance(report, ProfileReport):
        values = report.values()
        kernel = kernel or report.kernel
    else:
        values = dict(report)
    sm_pct = values.get(SM_THROUGHPUT)
    memory_pct = values.get(MEMORY_THROUGHPUT)
    if sm_pct is None or memory_pct is None:
        missing = [n for n, v in ((SM_THROUGHPUT, sm_pct), (MEMORY_THROUGHPUT, memory_pct)) if v is None]
        raise ValueError(f"the profile lacks {', '.join(missing)}: collect the SpeedOfLight section")
    bottleneck, reason = classify(sm_pct, memory_pct, settings.threshold_pct)
    ncu_seconds = values.get(DURATION)
    seconds = measured_us * 1e-6 if measured_us else ncu_seconds
    if bottleneck == "memory_bandwidth":
        key = _bandwidth_metrics(values, counted_bytes, ncu_seconds)
    elif bottleneck == "memory_latency":
        key = _latency_metrics(values) + _bandwidth_metrics(values, counted_bytes, ncu_seconds)[:2]
    else:
        key = _compute_metrics(values)
    line = None
    if ceilings is not None and seconds and (flops or counted_bytes):
        line = roofline(flops, counted_bytes, seconds, ceilings, "measured" if measured_us else "ncu", dtypes)
    return HardwareReport(
        kernel=kernel,
        bottleneck=bottleneck,
        sm_pct=sm_pct,
        memory_pct=memory_pct,
        threshold_pct=settings.threshold_pct,
        reason=reason,
        key_metrics=key,
        stalls=stall_reasons(values, settings.top_stalls),
        roofline=line,
    )
