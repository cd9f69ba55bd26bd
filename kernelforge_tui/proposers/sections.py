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
from kernelforge_tui.proposers.base import FailedSibling, LineageStep, ParentInfo, TargetGpu
from kernelforge_tui.proposers.prompting import Entry, Listing
from kernelforge_tui.vocabulary.evaluation import Diagnostic, ceiling_share_text
from kernelforge_tui.vocabulary.profiles import NodeProfile

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


HOPPER = (9, 0)
"""The first compute capability with thread block clusters and the Tensor Memory Accelerator."""


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


def gpu_text(gpu: TargetGpu | None, card: OperatorCard) -> str:
    """The GPU the candidates are measured on, from what its worker measured: what sizes grids to waves, blocks to
    the SM's shared memory and registers, and an edit to the ceilings it is held to; a simulated run says so."""
    if gpu is not None and gpu.simulated:
        return (
            f"None: this run is simulated ({gpu.name}). Its timings are invented from the source, not measured, so "
            "no GPU's limits are known here; write what would be fast on a recent NVIDIA data-centre GPU."
        )
    c = gpu.ceilings if gpu is not None else None
    if c is None:
        where = f"{gpu.name}, " if gpu is not None else ""
        return f"{where}not measured yet: write what would be fast on a recent NVIDIA data-centre GPU."
    major, minor = c.capability
    lines = [f"{c.gpu_name}, sm_{major}{minor} (compute capability {major}.{minor}), as its GPU worker measured it:"]
    lines.append(
        f"- {c.sm_count} SMs: one wave of a grid is {c.sm_count} times the blocks that fit on one SM at once; "
        f"L2 cache {_size(c.l2_bytes)} (flushed before every timed launch)."
    )
    if c.shared_per_sm_bytes is not None and c.registers_per_sm is not None and c.threads_per_sm is not None:
        lines.append(
            f"- Per SM: {_size(c.shared_per_sm_bytes)} of shared memory, {c.registers_per_sm} 32-bit registers and "
            f"{c.threads_per_sm} threads, shared by the blocks resident on it."
        )
    if c.shared_per_block_bytes is not None:
        lines.append(
            f"- Per block: at most 1024 threads and {_size(c.shared_per_block_bytes)} of shared memory: static "
            "__shared__ arrays up to 48 KiB, beyond that dynamic (extern __shared__, sized by the launch plan's "
            "shared_bytes; the harness raises the kernel's limit)."
        )
    held = c.compute_tflops(t.dtype for t in card.inputs)
    rate = "the measured FP32 FMA rate" if held == c.fma_tflops else "the dense 16-bit tensor-core rate, derived"
    lines.append(
        f"- Ceilings this card is held to: {c.copy_gbps:.0f} GB/s copy bandwidth (measured, bytes read plus written) "
        f"and {held:.0f} TFLOP/s ({rate}); a kernel timed faster than they allow fails as a cheat."
    )
    if c.capability >= HOPPER:
        lines.append(
            "- Available on this architecture: thread block clusters (a compile-time __cluster_dims__ on the "
            "kernel, the grid a multiple of it; the launch plan has no cluster field) with distributed shared "
            "memory, and the Tensor Memory Accelerator's bulk copies that need no tensor map (cp.async.bulk with an "
            "mbarrier). Tiled TMA needs a tensor map, which only host code can make: not available to a candidate."
        )
    else:
        lines.append("- No thread block clusters or TMA on this architecture (they need sm_90 or newer).")
    return "\n".join(lines)


def plan_json(plan: LaunchPlan) -> str:
    return plan.model_dump_json()


def kernel_text(source: str, plan: LaunchPlan, numbered: bool = False) -> str:
    """The source in a CUDA block and the plan in a JSON block; `numbered` prefixes each line with its number as the
    compiler counts them (`  12 | `), for a reader matching diagnostics to lines."""
    lines = source.rstrip().splitlines()
    if numbered:
        width = len(str(len(lines)))
        lines = [f"{i:>{width}} | {line}" for i, line in enumerate(lines, start=1)]
    body = "\n".join(lines)
    return f"```cuda\n{body}\n```\nLaunch plan:\n```json\n{plan_json(plan)}\n```"


DIAGNOSTICS_SHOWN = 20
"""A debugger sees this many of a build's messages, errors first (the first errors are the cause; the rest are
mostly their echoes)."""
MESSAGE_CHARS = 400
LINE_CHARS = 200


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def diagnostics_text(diagnostics: Sequence[Diagnostic], shown: int = DIAGNOSTICS_SHOWN) -> str:
    """The build's messages, errors first in the compiler's order, each placed and with the source line it names."""
    if not diagnostics:
        return "(none recorded)"
    ordered = sorted(diagnostics, key=lambda d: d.severity != "error")
    lines = []
    for d in ordered[:shown]:
        where = d.file if d.line is None else f"{d.file}:{d.line}" + (f":{d.column}" if d.column else "")
        lines.append(f"{where}: {d.severity}: {_cut(' '.join(d.message.split()), MESSAGE_CHARS)}")
        if d.line is not None and d.source_line:
            lines.append(f"    {d.line} | {_cut(d.source_line.rstrip(), LINE_CHARS)}")
    if len(ordered) > shown:
        lines.append(f"({len(ordered) - shown} more messages left out)")
    return "\n".join(lines)


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


def speed_text(
    speedup: float | None, latency_us: float | None = None, share: float | None = None, simulated: bool = False
) -> str:
    """How fast a kernel measured, in the words the metrics pane uses: its speedup, its time a call, and its share
    of the ceiling (`ceiling_share_text`, which says when the ceiling is a simulated one)."""
    parts = [f"{speedup:.3g}x the baseline"] if speedup is not None else []
    parts += [f"{latency_us:.2f} us a call (median)"] if latency_us is not None else []
    parts += [ceiling_share_text(share, simulated)] if share is not None else []
    return ", ".join(parts) or "not measured"


def parent_speed(parent: ParentInfo, gpu: TargetGpu | None) -> str:
    return speed_text(parent.speedup, parent.latency_us, parent.ceiling_share, gpu is not None and gpu.simulated)


def lineage_listing(lineage: Sequence[LineageStep]) -> Listing:
    entries = [
        Entry(
            step.id,
            f"#{step.id} {step.mutation}: {speed_text(step.speedup)}",
            f"#{step.id} {first_line(step.mutation, 60)}: {speed_text(step.speedup)}",
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
