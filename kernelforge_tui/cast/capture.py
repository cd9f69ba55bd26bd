"""Exporting from a capture directory: every variant of `capture.json` gets an audit line, and each carded,
replaceable variant whose search proved a kernel gets that kernel.

Where a variant's run is: among the runs under the roots given (`--runs`, else `<capture>/runs` and the default runs
root), the runs whose card directory is the variant's card directory; the one whose exported kernel is fastest
against its baseline wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

from kernelforge_tui.capture.manifest import Variant, load_capture
from kernelforge_tui.cards.directory import load_card
from kernelforge_tui.cards.errors import CardError
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cast.bindings import CallBinding, from_variant, normalize_overload
from kernelforge_tui.cast.export import Collected, admits, collect_run
from kernelforge_tui.cast.manifest import AuditEntry, PerForward
from kernelforge_tui.store import DB_NAME, RunStore, StoreError, runs_root


def runs_for(card_dir: Path, roots: Sequence[Path]) -> list[Path]:
    """Run directories under `roots` (one level deep) whose card directory is `card_dir`."""
    wanted = card_dir.resolve()
    found: list[Path] = []
    for root in roots:
        if not root.is_dir():
            continue
        for db in sorted(root.glob(f"*/{DB_NAME}")):
            try:
                with RunStore.open(db.parent, readonly=True) as store:
                    if store.card_dir().resolve() == wanted:
                        found.append(db.parent)
            except StoreError:
                continue
    return found


def collect_capture(capture_dir: Path, runs: Sequence[Path] = ()) -> Collected:
    capture = load_capture(capture_dir)
    roots = list(runs) or [capture_dir / "runs", runs_root()]
    collected = Collected()
    for variant in capture.variants:
        common = {"variant": f"{variant.id} {variant.title}", "overload": _overload(variant)}
        collected.order.append(str(common["variant"]))
        if variant.status != "card" or variant.card is None:
            reason = variant.reason or f"no card ({variant.status})"
            collected.audit.append(AuditEntry(**common, decision="fallback", reason=reason))
            continue
        card_dir = capture_dir / variant.card
        common["card"] = variant.card
        try:
            spec = load_card(card_dir).spec
            binding = from_variant(variant, spec)
        except CardError as exc:
            binding = str(exc)
        if isinstance(binding, str):  # not overridable whatever its search found
            collected.audit.append(AuditEntry(**common, decision="fallback", reason=binding))
            continue
        candidates = runs_for(card_dir, roots)
        if not candidates:
            where = ", ".join(str(r) for r in roots)
            reason = f"no run of its card {variant.card} under {where}: `kernelforge optimize {capture_dir}` first"
            collected.audit.append(AuditEntry(**common, decision="fallback", reason=reason))
            continue
        best: Collected | None = None
        for run_dir in candidates:
            try:
                one = collect_run(run_dir, partial(from_variant, variant))
            except CardError as exc:
                collected.audit.append(AuditEntry(**common, decision="fallback", reason=str(exc), run=run_dir.name))
                continue
            if best is None or _speedup(one) > _speedup(best):
                best = one
        if best is None:
            continue
        for found in best.found:
            found.variant = str(common["variant"])
            found.per_forward = per_forward(found.binding, spec, variant, capture.variants)
        for entry in best.audit:
            collected.audit.append(entry.model_copy(update={"variant": common["variant"], "card": variant.card}))
        collected.found += best.found
        collected.notes += best.notes
    return collected


def per_forward(binding: CallBinding, spec: OperatorCard, own: Variant, variants: Sequence[Variant]) -> PerForward:
    """The calls of one forward pass the kernel's guard admits: its own variant's, and those of every other variant
    of the capture that binds to the kernel's card with calls the guard admits (`admits`)."""
    names = {t.name for t in [*spec.inputs, *spec.outputs]}
    covered = [own]
    for other in variants:
        if other.id == own.id or other.kind != own.kind or {b.tensor for b in other.bindings} != names:
            continue  # another kind of call, or tensors the card does not name
        theirs = from_variant(other, spec)
        if not isinstance(theirs, str) and admits(binding, theirs):
            covered.append(other)
    return PerForward(calls=sum(v.calls for v in covered), variants=[v.id for v in covered])


def _overload(variant: Variant) -> str | None:
    return normalize_overload(variant.steps[0].op) if variant.kind == "op" and variant.steps else None


def _speedup(collected: Collected) -> float:
    best = 0.0
    for found in collected.found:
        result = found.evaluation.result if found.evaluation is not None else None
        if result is not None and result.speedup is not None:
            best = max(best, result.speedup)
    return best
