"""The text the agents' prompts are made of: the card, a kernel and its plan, the profile, ptxas, the lineage and
the failed siblings, each written once so every role reads them the same way.

Why the profile section is the hardware report and not ncu's metrics: the analysis layer already classified the
kernel and kept the metrics that matter for its class (CUDAMaster's filter); the full report is hundreds of lines
a model would have to sift (bench/analyst_tokens.py measures the difference).
"""

from __future__ import annotations

from collections.abc import Sequence

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.cards.stress import running
from kernelforge_tui.models.profiles import NodeProfile
from kernelforge_tui.proposers.base import FailedSibling, LineageStep, ParentInfo
from kernelforge_tui.proposers.prompting import Entry, Listing

REASON_CHARS = 1500
"""A failed sibling's reason in full is cut here (a compiler can print pages; the first errors are the cause)."""
SHORT_CHARS = 120


def first_line(text: str, limit: int = SHORT_CHARS) -> str:
    """The first non-empty line, cut to `limit` characters."""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def bullets(items: Sequence[str], empty: str) -> str:
    return "\n".join(f"- {item}" for item in items) if items else empty


def operator_line(card: OperatorCard) -> str:
    """The operator in one line: name, family, sizes and the least work it must do."""
    sizes = ", ".join(f"{name} = {value}" for name, value in card.sizes.items())
    return (
        f"{card.name} (family {card.family}), sizes {sizes}; least work {card.flops()} FLOPs ({card.cost.flops}) "
        f"and {card.bytes_moved()} bytes ({card.cost.bytes})"
    )


def card_text(card: OperatorCard) -> str:
    """What the operator computes and on what: description, sizes, tensors, tolerances, least work, stress sets."""

    def shape(spec: str, dims: Sequence[object], concrete: tuple[int, ...]) -> str:
        return f"{spec}[{', '.join(map(str, dims))}] = {' x '.join(map(str, concrete))}"

    inputs = [f"{t.name}: {shape(t.dtype, t.shape, t.dims(card.sizes))}" for t in card.inputs]
    outputs = []
    for out in card.outputs:
        tol = out.effective_tolerance()
        outputs.append(
            f"{out.name}: {shape(out.dtype, out.shape, out.dims(card.sizes))}; correct where "
            f"|out - ref| <= {tol.atol:g} + {tol.rtol:g} * |ref| (NaN exactly where the reference is NaN)"
        )
    stress = [f"{s.label}: {s.holds}" for s in running(card)]
    return "\n".join(
        [
            f"Operator {operator_line(card)}.",
            card.description.strip() or "(no description)",
            "Inputs (device pointers, row-major):",
            bullets(inputs, "(none)"),
            "Outputs:",
            bullets(outputs, "(none)"),
            "Besides the card's input sets, every kernel is checked on these stress inputs:",
            bullets(stress, "(none for this family)"),
        ]
    )


def plan_json(plan: LaunchPlan) -> str:
    return plan.model_dump_json()


def kernel_text(source: str, plan: LaunchPlan) -> str:
    return f"```cuda\n{source.rstrip()}\n```\nLaunch plan:\n```json\n{plan_json(plan)}\n```"


def profile_text(profile: NodeProfile | None) -> str:
    """The hardware report (bottleneck class and the metrics for that class), or why there is none."""
    if profile is None:
        return "Not profiled: judge the bottleneck from the code and the card's least work."
    return "\n".join(profile.hardware.lines())


def ptxas_text(parent: ParentInfo) -> str:
    """The parent's resource use: from its build, else from its profile."""
    stats = parent.ptxas or (parent.profile.ptxas if parent.profile is not None else None)
    if stats is None:
        return "Not known."
    return (
        f"{stats.registers} registers per thread, {stats.shared_bytes} bytes of static shared memory, "
        f"{stats.barriers} barriers, {stats.stack_frame_bytes} bytes of stack, spills: "
        f"{stats.spill_store_bytes} bytes stored, {stats.spill_load_bytes} bytes loaded."
    )


def speedup_text(speedup: float | None) -> str:
    return f"{speedup:.3g}x the baseline" if speedup is not None else "not measured"


def lineage_listing(lineage: Sequence[LineageStep]) -> Listing:
    entries = [
        Entry(
            step.id,
            f"#{step.id} {step.mutation}: {speedup_text(step.speedup)}",
            f"#{step.id} {first_line(step.mutation, 60)}: {speedup_text(step.speedup)}",
        )
        for step in lineage
    ]
    return Listing(entries, "earlier steps", "(the card's baseline: no earlier steps)")


def failure_entry(failed: FailedSibling) -> Entry:
    reason = failed.reason.strip() or "(no reason recorded)"
    if len(reason) > REASON_CHARS:
        reason = reason[:REASON_CHARS] + " […]"
    head = f"#{failed.node_id} ({failed.failure}) {first_line(failed.summary, 80)!r}"
    by = f" by {failed.proposer}" if failed.proposer else ""
    return Entry(failed.node_id, f"{head}{by}:\n{reason}", f"{head}: {first_line(reason)}")


def failures_listing(failed: Sequence[FailedSibling]) -> Listing:
    entries = [failure_entry(f) for f in sorted(failed, key=lambda f: f.node_id)]
    return Listing(entries, "older failures", "(none)")
