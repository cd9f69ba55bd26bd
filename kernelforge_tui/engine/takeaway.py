"""Take a kernel away from a run: its source, its launch plan and a summary a person can read and keep.

`write_kernel` is what `kernelforge show` and the TUI's export key both call: `kernel.cu`, `plan.toml` (the
LaunchPlan at top level, as `cards.plan.load_plan` reads it, so `kernelforge eval CARD kernel.cu --plan plan.toml`
runs it again) and `summary.md` (what the node is, how fast, how it was checked, why the search scored it so, and
where it came from). `progress` is the run's best so far over its candidates, for the charts.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from kernelforge_tui.cards.directory import to_toml
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.engine.backend import SIMULATED
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.evaluation import Evaluation, ceiling_share_text, speedup_text
from kernelforge_tui.vocabulary.nodes import MEASURED, NodeRecord, NodeStatus
from kernelforge_tui.vocabulary.rewards import Reward
from kernelforge_tui.vocabulary.runs import RunInfo

KERNEL_FILE = "kernel.cu"
PLAN_FILE = "plan.toml"
SUMMARY_FILE = "summary.md"


class KernelSummary(BaseModel):
    """One node of a run as `show` reports it (its --json) and `summary.md` says it."""

    run_id: str
    run_dir: Path
    card_name: str
    family: str
    card_dir: Path
    node_id: int
    parent_id: int | None
    status: NodeStatus
    failure: str | None
    reason: str
    best: bool
    """The run's promoted best node."""
    gpu_name: str
    simulated: bool
    """The run's timings were invented (no GPU ran anything): its speedups mean nothing."""
    speedup: float | None
    speedup_interval: tuple[float, float] | None
    """95% bootstrap interval of the speedup; None in runs recorded before intervals were measured."""
    latency_us: float | None
    latency_p10_us: float | None
    latency_p90_us: float | None
    latency_cv: float | None
    baseline_latency_us: float | None
    ceiling_share: float | None
    checks: list[str]
    """What the kernel passed, in words; empty when it was not proven correct."""
    reward: Reward | None
    proposer: str
    mutation: str
    params: dict[str, int | str | float]
    hints: list[str]
    repair_of: int | None
    plan: LaunchPlan


def summarize(store: RunStore, node_id: int) -> KernelSummary:
    """The node's summary from the run's store (UnknownNode when the run holds no such node)."""
    record = store.node_record(node_id)
    info = store.run_info()
    evaluation = store.evaluation(node_id)
    result = evaluation.result if evaluation else None
    timing = result.candidate if result else None
    interval = store.node(node_id).speedup_interval or (result.speedup_interval if result else None)
    return KernelSummary(
        run_id=info.run_id,
        run_dir=info.run_dir,
        card_name=info.card_name,
        family=info.family,
        card_dir=store.card_dir(),
        node_id=record.id,
        parent_id=record.parent_id,
        status=record.status,
        failure=record.failure.value if record.failure else None,
        reason=record.reason,
        best=info.best_node_id == record.id,
        gpu_name=info.gpu_name,
        simulated=info.backend == SIMULATED,
        speedup=record.speedup,
        speedup_interval=interval,
        latency_us=record.latency_us,
        latency_p10_us=timing.p10_us if timing else None,
        latency_p90_us=timing.p90_us if timing else None,
        latency_cv=timing.cv if timing else None,
        baseline_latency_us=result.baseline.median_us if result and result.baseline else None,
        ceiling_share=record.ceiling_share,
        checks=passed_checks(record, evaluation),
        reward=record.reward,
        proposer=record.proposer,
        mutation=record.mutation,
        params=dict(record.params),
        hints=list(record.hints),
        repair_of=record.repair_of,
        plan=record.plan,
    )


def passed_checks(record: NodeRecord, evaluation: Evaluation | None) -> list[str]:
    """The checks a measured node passed, in words (what `ok` from the worker vouches for)."""
    if record.status not in MEASURED or evaluation is None or evaluation.result is None:
        return []
    result = evaluation.result
    checks = ["source check (device code only, no host calls) and nvcc build"]
    sets = [c.name for c in result.checks if c.ok and not c.name.endswith("(second run)")]
    if sets:
        checks.append(f"outputs within the card's tolerance on {len(sets)} input sets: {', '.join(sets)}")
    checks.append("no write outside its outputs, inputs left unmodified (canary regions checked after every launch)")
    if any(c.name.endswith("(second run)") and c.ok for c in result.checks):
        checks.append("a second run from a different buffer content gives the same answer (no stale reads)")
    if result.deterministic:
        checks.append("deterministic: the same bits on both runs")
    if result.candidate is not None:
        checks.append(
            f"right on each of its {result.candidate.reps} timed launches, every one checked (no work skipped on any), "
            "and its fastest tenth within what the card's roofline floor allows"
        )
    return checks


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} us"


PEAK_VS_CEILING = (
    "the share of the ceiling is the kernel's useful bytes (or FLOPs) a second over the copy (or matrix) rate "
    "measured on this GPU; ncu's % of peak is the busiest unit's utilisation, which counts every byte it moved"
)
"""How the share of the ceiling differs from Nsight Compute's "% of peak", wherever both are shown."""


def render_summary(s: KernelSummary) -> str:
    """The summary as Markdown: `summary.md`, and what `show` prints."""
    title = f"# {s.card_name}: node {s.node_id}" + (" (the run's best)" if s.best else "")
    lines = [title, ""]
    if s.simulated:
        lines += ["**SIMULATED run: the timings are invented, no GPU ran anything; the speedups mean nothing.**", ""]
    if s.status not in MEASURED:
        why = f" ({s.failure}: {s.reason})" if s.failure else ""
        lines += [f"**Not proven correct: the node is {s.status.value}{why}.**", ""]
    if s.speedup is None:
        speed = "-"
    else:
        speed = speedup_text(s.speedup, s.speedup_interval, 2) + " over the card's baseline"
        if s.speedup_interval is None and s.latency_p10_us is not None and s.latency_p90_us is not None:
            speed += (
                f" (no interval recorded; kernel time spread p10-p90 {s.latency_p10_us:.4g}-{s.latency_p90_us:.4g} us"
            )
            speed += f", CV {s.latency_cv:.1%})" if s.latency_cv is not None else ")"
    latency = _us(s.latency_us)
    if s.latency_us is not None and s.latency_p10_us is not None and s.latency_p90_us is not None:
        latency += f" median (p10 {s.latency_p10_us:.4g}, p90 {s.latency_p90_us:.4g})"
    rows = [
        ("card", f"{s.card_name} ({s.family}), {s.card_dir}"),
        ("node", f"{s.node_id}, {s.status.value}" + (f", parent {s.parent_id}" if s.parent_id is not None else "")),
        ("speedup", speed),
        (
            "share of the ceiling",
            "-"
            if s.ceiling_share is None
            else f"{ceiling_share_text(s.ceiling_share, s.simulated)} ({PEAK_VS_CEILING})",
        ),
        ("latency", latency),
        ("baseline latency", _us(s.baseline_latency_us)),
        ("GPU", s.gpu_name),
        ("backend", "SIMULATED (invented timings)" if s.simulated else "GPU (measured)"),
    ]
    lines += ["| | |", "| --- | --- |", *[f"| {k} | {_cell(v)} |" for k, v in rows], ""]
    lines += ["## Checks passed", ""]
    lines += [f"- {c}" for c in s.checks] or ["- none: the kernel was not proven correct"]
    lines += ["", "## Why the search scored it so", ""]
    if s.reward is None:
        lines.append("No reward recorded (not measured, or a run recorded before rewards were kept).")
    else:
        lines += [f"{s.reward.explanation}", "", f"Reward {s.reward.total:.4g}, the sum of:", ""]
        lines += [f"- {t.name} {t.value:+.4g}: {t.explanation}" for t in s.reward.terms]
    lines += ["", "## Provenance", ""]
    lines += [f"- run {s.run_id} ({s.run_dir}), node {s.node_id}"]
    lines += [f"- proposer {s.proposer or '-'}; mutation: {s.mutation or '-'}"]
    if s.params:
        lines.append("- parameters: " + ", ".join(f"{k}={v}" for k, v in s.params.items()))
    if s.hints:
        lines.append("- hints: " + "; ".join(s.hints))
    if s.repair_of is not None:
        lines.append(f"- repairs node {s.repair_of}")
    lines += [
        "",
        "## Use it",
        "",
        f"`{KERNEL_FILE}` is device code; `{PLAN_FILE}` says how to launch it over the card's sizes. "
        "Check it again on this machine:",
        "",
        f"    kernelforge eval {s.card_dir} {KERNEL_FILE} --plan {PLAN_FILE}",
        "",
    ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def plan_toml(plan: LaunchPlan) -> str:
    """The plan as the TOML `load_plan` reads: its fields at top level."""
    return to_toml(plan.model_dump(mode="json"))


def write_kernel(store: RunStore, node_id: int, out_dir: Path) -> Path:
    """Write the node's `kernel.cu`, `plan.toml` and `summary.md` into `out_dir` (made when missing); returns it.

    UnknownNode when the run holds no such node; BadInput when `out_dir` cannot be written."""
    summary = summarize(store, node_id)
    source, _ = store.node_source(node_id)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / KERNEL_FILE).write_text(source)
        (out_dir / PLAN_FILE).write_text(plan_toml(summary.plan))
        (out_dir / SUMMARY_FILE).write_text(render_summary(summary))
    except OSError as exc:
        raise BadInput(f"cannot write the kernel into {out_dir} ({exc.strerror}): pick another directory") from None
    return out_dir


def default_out_dir(info: RunInfo, node_id: int) -> Path:
    """Where a kernel goes when no directory is given: `RUN-node-N` in the working directory."""
    return Path(f"{info.run_id}-node-{node_id}")


class ProgressPoint(BaseModel):
    """The run after its n-th finished candidate: the fastest so far and the best share of the ceiling so far."""

    candidates: int
    node_id: int
    best_speedup: float | None
    best_ceiling_share: float | None


def progress(store: RunStore) -> list[ProgressPoint]:
    """One point per finished candidate (failures count: they are candidates the search spent), in the order the
    search measured them; the speedup and ceiling share are the best of the measured nodes so far."""
    finished = [r for r in store.node_records() if r.last_measurement is not None]
    finished.sort(key=lambda r: r.last_measurement or 0)
    points: list[ProgressPoint] = []
    best_speedup: float | None = None
    best_share: float | None = None
    for n, record in enumerate(finished, start=1):
        if record.status in MEASURED:
            if record.speedup is not None:
                best_speedup = max(best_speedup or 0.0, record.speedup)
            if record.ceiling_share is not None:
                best_share = max(best_share or 0.0, record.ceiling_share)
        points.append(
            ProgressPoint(candidates=n, node_id=record.id, best_speedup=best_speedup, best_ceiling_share=best_share)
        )
    return points
