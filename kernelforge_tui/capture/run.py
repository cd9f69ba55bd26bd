"""`kernelforge capture`: from a model file to a capture directory (manifest + one card per carded variant).

The steps: import the user's file and build the model (`loader`), two eager warm-up passes, pass A records every aten
call (`recorder.record`), fused patterns are found and calls grouped into variants (`patterns`, `calls`), each
variant is planned as a card or refused with a reason (`families`), pass B copies a few sampled calls' tensors, pass
C times every call, the variants are ranked by expected saving (`ranking`), and the cards and the manifest are
written into a temporary directory beside the destination, renamed into place only when everything is written.

torch is imported here only inside `capture_model` (through `recorder`), so importing this module, and everything
the CLI imports, works without torch.
"""

from __future__ import annotations

import importlib
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

import kernelforge_tui
from kernelforge_tui.capture import families, patterns, ranking
from kernelforge_tui.capture.calls import Call, Group, group_calls
from kernelforge_tui.capture.cards import CardRefused, write_card
from kernelforge_tui.capture.deadline import Stage, deadline
from kernelforge_tui.capture.loader import Entry, build
from kernelforge_tui.capture.manifest import CaptureManifest, Json, Variant, save_capture
from kernelforge_tui.cards import expr
from kernelforge_tui.cards.directory import MAX_STORED_SET_BYTES
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.errors import BadInput, install_fix

if TYPE_CHECKING:
    from kernelforge_tui.capture.recorder import Timings


TemplateCheck = Callable[[OperatorCard], str | None]
"""Why the search's proposer cannot serve a card (None: it can); the CLI passes the template library's check."""


def require_torch() -> ModuleType:
    """The recorder module (which imports torch); BadInput saying how to install torch when it is missing."""
    try:
        return importlib.import_module("kernelforge_tui.capture.recorder")
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "torch":
            raise BadInput(
                f"capture runs the model with PyTorch, which is not installed here: {install_fix('torch')} "
                "(or pip install torch); everything else in kernelforge works without it"
            ) from None
        raise


@dataclass(frozen=True)
class CaptureRequest:
    model_file: Path
    out: Path
    entry: str = "build"
    kwargs: dict[str, Json] | None = None
    device: str | None = None
    samples: int = 2
    repeats: int = 5
    force: bool = False
    max_set_bytes: int = MAX_STORED_SET_BYTES
    """A sampled call whose card tensors take more is not stored (the card draws seeded sets instead)."""
    timeout_s: float | None = None
    """The model's import, build and passes may take this long in all (None: no limit; the CLI sets `[capture]`'s)."""


def default_out(model_file: Path) -> Path:
    return Path(f"{model_file.stem}.capture")


def _title(group: Group) -> str:
    if group.kind == "pattern":
        first = next(a.tensor for a in group.steps[0].args if a.tensor is not None)
        assert first is not None
        return f"{group.op} (fused: {len(group.steps)} calls) {first.dtype} {first.shape}"
    step = group.steps[0]
    shapes = [a.tensor.shape for a in step.args if a.tensor is not None]
    dtypes = sorted({a.tensor.dtype for a in step.args if a.tensor is not None})
    return f"{step.op} {'/'.join(dtypes)} {' '.join(str(s) for s in shapes)}".strip()


def _eager_bytes(group: Group) -> int:
    """Bytes the variant's eager call(s) move per instance: every tensor argument read and every result written."""
    total = 0
    for step in group.steps:
        metas = [a.tensor for a in step.args if a.tensor is not None] + [m for m in step.outputs if m is not None]
        for meta in metas:
            if meta is not None and meta.dtype in NUMPY:
                total += meta.numel * NUMPY[meta.dtype].itemsize
    return total if not all(s.view for s in group.steps) else 0


def _check_out(out: Path, force: bool) -> None:
    """Before the model runs: the output directory is free (or --force and a directory) and can be made, so that a
    capture is not lost at its end, after the model ran for minutes."""
    if out.exists() and not force:
        raise BadInput(f"{out} exists: pass --force to replace it, or -o another directory")
    if out.exists() and not out.is_dir():
        raise BadInput(f"{out} exists and is not a directory: remove it, or -o another directory")
    parent = out.absolute().parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir():
        raise BadInput(f"{out} cannot be made: {existing} is not a directory; -o a directory elsewhere")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BadInput(f"{out} cannot be made: {existing} is not writable; -o a directory you can write")


class CaptureInterrupted(KeyboardInterrupt):
    """Ctrl-C during a capture, saying what it interrupted and what is on disk. Still a KeyboardInterrupt, so that a
    caller that stops on Ctrl-C (the bench) stops; the CLI prints the message as its one line."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True)
class _Recorded:
    """What the model's passes gave: its calls, their variants and plans, the sampled tensors and the timings."""

    calls: list[Call]
    groups: list[Group]
    trace: list[int]
    plans: list[families.CardPlan | families.NoCard]
    samples: dict[tuple[int, int], dict[str, np.ndarray]]
    timings: Timings


def capture_model(
    request: CaptureRequest,
    template_check: TemplateCheck | None = None,
    progress: Callable[[str], None] | None = None,
) -> CaptureManifest:
    """Capture the model and write the capture directory `request.out`; its manifest. Ctrl-C raises
    CaptureInterrupted; a model that runs past `request.timeout_s` raises CaptureTimeout; nothing is written then."""
    say = progress or (lambda _: None)
    if request.samples < 0 or request.repeats < 1:
        raise BadInput("--samples must be 0 or more and --repeats 1 or more")
    _check_out(request.out, request.force)
    stage = Stage("loading torch")
    written = False
    try:
        recorder = require_torch()
        entry = Entry.parse(request.entry)
        device = recorder.resolve_device(request.device)
        kwargs = dict(request.kwargs or {})
        with deadline(request.timeout_s, stage):
            recorded = _record(request, recorder, entry, device, kwargs, stage, say)
        stage.now = f"writing the cards into a temporary directory beside {request.out}"
        manifest, old = _manifest(request, recorder, entry, device, kwargs, recorded, template_check, say)
        written = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except KeyboardInterrupt as exc:
        if isinstance(exc, CaptureInterrupted):
            raise
        if written:
            raise CaptureInterrupted(f"capture interrupted after {request.out} was written") from None
        kept = f"; {request.out} is as it was" if request.out.exists() else ""
        raise CaptureInterrupted(f"capture interrupted while {stage.now}: nothing was written{kept}") from None
    return manifest


def _record(
    request: CaptureRequest,
    recorder: ModuleType,
    entry: Entry,
    device: str,
    kwargs: dict[str, Json],
    stage: Stage,
    say: Callable[[str], None],
) -> _Recorded:
    """Import and build the model, and run its passes: warm-up, recording, sampling, timing."""
    stage.now = "importing the model file and building the model"
    say(f"building the model: {request.model_file} {entry}(device={device!r})")
    built = build(request.model_file, entry, {"device": device, **kwargs})
    stage.now = "running the model's warm-up passes"
    recorder.warm_up(built, request.model_file, device)
    stage.now = "recording the aten calls of one forward pass"
    say(stage.now)
    calls: list[Call] = recorder.record(built, request.model_file)
    groups, trace = group_calls(calls, patterns.find(calls))
    plans = [families.plan(g) for g in groups]
    taps = []
    for g, (group, plan) in enumerate(zip(groups, plans, strict=True)):
        if not isinstance(plan, families.CardPlan):
            continue
        for instance in group.sampled(request.samples):
            indices = group.instances[instance]
            for t in plan.tensors:
                card_shape = tuple(families._eval_dims(t.dims, plan.sizes))
                result = int(t.path.removeprefix("out[").rstrip("]")) if t.role == "output" else 0
                key = (g, instance)
                tap = recorder.Tap(indices[t.step], t.role, t.path, result, key, t.name, card_shape, t.order)
                taps.append(tap)
    stage.now = "copying the tensors of sampled calls (a forward pass)"
    say(f"{len(calls)} aten calls, {len(groups)} variants; copying {len(taps)} tensors of sampled calls")
    samples: dict[tuple[int, int], dict[str, np.ndarray]] = recorder.sample(built, request.model_file, calls, taps)
    stage.now = f"timing {request.repeats} forward passes"
    say(f"timing {request.repeats} forward passes ({'CUDA' if device.startswith('cuda') else 'CPU'})")
    timings = recorder.time_calls(built, request.model_file, calls, device, request.repeats)
    return _Recorded(calls, groups, trace, plans, samples, timings)


def _manifest(
    request: CaptureRequest,
    recorder: ModuleType,
    entry: Entry,
    device: str,
    kwargs: dict[str, Json],
    recorded: _Recorded,
    template_check: TemplateCheck | None,
    say: Callable[[str], None],
) -> tuple[CaptureManifest, Path | None]:
    """Write the cards and the manifest into a temporary directory beside the destination, then move it into place;
    with the old capture it replaced, moved aside (the caller deletes it)."""
    timings = recorded.timings
    total_us = sum(timings.per_call_us)
    out = request.out
    work = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    try:
        variants = _variants(
            request, recorded.groups, recorded.plans, recorded.samples, timings, total_us, work, template_check, say
        )
        manifest = CaptureManifest(
            kernelforge_version=kernelforge_tui.__version__,
            torch_version=str(recorder.torch.__version__),
            model_file=str(request.model_file),
            entry=str(entry),
            entry_kwargs=kwargs,
            device=device,
            device_name=timings.device_name,
            capability=timings.capability,
            timing=timings.method,
            timing_note=timings.note,
            repeats=timings.repeats,
            total_time_us=total_us,
            forward_wall_us=timings.forward_wall_us,
            calls=len(recorded.calls),
            copy_gbps=timings.copy_gbps,
            created_at=time.time(),
            variants=ranking.ranked(variants),
            trace=[f"v{g + 1:02d}" for g in recorded.trace],
        )
        save_capture(manifest, work)
        old = _move_into_place(work, out, request.force)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest, old


def _move_into_place(work: Path, out: Path, force: bool) -> Path | None:
    """`work` becomes `out`. An old `out` (--force) is moved aside first, and returned to be deleted once `work` is in
    place, so that an interruption leaves the old capture or the new one whole, never half of one."""
    if out.exists() and not force:
        raise BadInput(f"{out} appeared while the model ran: pass --force to replace it, or -o another directory")
    if not out.exists():
        work.rename(out)
        return None
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    out.rename(old)
    try:
        work.rename(out)
    except BaseException:
        old.rename(out)
        raise
    return old


def _variants(
    request: CaptureRequest,
    groups: list[Group],
    plans: list[families.CardPlan | families.NoCard],
    samples: dict[tuple[int, int], dict[str, np.ndarray]],
    timings: Timings,
    total_us: float,
    work: Path,
    template_check: TemplateCheck | None,
    say: Callable[[str], None],
) -> list[Variant]:
    taken: set[str] = set()
    variants: list[Variant] = []
    for g, (group, plan) in enumerate(zip(groups, plans, strict=True)):
        vid = f"v{g + 1:02d}"
        time_us = sum(timings.per_call_us[i] for instance in group.instances for i in instance)
        share = time_us / total_us if total_us > 0 else 0.0
        base = {
            "id": vid,
            "rank": 0,
            "kind": group.kind,
            "op": group.op,
            "title": _title(group),
            "steps": group.steps,
            "calls": len(group.instances),
            "instances": group.instances if group.kind == "pattern" else [],
            "time_us": time_us,
            "share": share,
        }
        if isinstance(plan, families.NoCard):
            variants.append(Variant(**base, status=plan.status, reason=plan.reason))
            continue
        name = families.card_name(plan, taken)
        per_call = time_us / len(group.instances)
        description = (
            f"{plan.what}.\nCaptured by `kernelforge capture` from {request.model_file.name} ({vid}: "
            f"{' -> '.join(s.op for s in group.steps)}): {len(group.instances)} call(s) per forward pass, "
            f"{share:.1%} of the eager time ({timings.method}, {per_call:.3g} us per call on {timings.device_name}).\n"
            "Reference: reference.py re-runs the captured aten call(s) with torch on the CPU. Stored sets hold "
            "sampled calls' inputs and eager outputs." + "".join(f"\n{note}" for note in plan.notes)
        )
        sampled = [samples[(g, k)] for k in group.sampled(request.samples) if (g, k) in samples]
        try:
            written = write_card(work / name, name, plan, group.steps, sampled, description, request.max_set_bytes)
        except CardRefused as exc:
            variants.append(Variant(**base, status="unsupported", reason=str(exc)))
            continue
        say(f"card {name}: {plan.family}, {len(group.instances)} call(s), {share:.1%} of the time")
        problem = plan.template_problem
        if problem is None and template_check is not None:
            problem = template_check(written.card.spec)
        guess = ranking.estimate(
            family=plan.family,
            op=plan.op,
            pattern=group.kind == "pattern",
            per_call_us=per_call,
            card_bytes=plan.bytes_per_call(),
            eager_bytes=_eager_bytes(group),
            copy_gbps=timings.copy_gbps,
            card_flops=expr.evaluate(plan.flops, plan.sizes),
            dtype=plan.dtype,
        )
        reason = f"reference in {written.precision}; {written.stored} stored set(s)"
        reason += "".join(f"; {note}" for note in [*plan.notes, *written.notes])
        variants.append(
            Variant(
                **base,
                bytes_per_call=plan.bytes_per_call(),
                family=plan.family,
                status="card",
                reason=reason,
                card=name,
                bindings=plan.bindings(),
                template=problem is None,
                template_note=problem or "",
                expected_speedup=guess.speedup,
                expected_saving=ranking.saving(share, guess.speedup),
                estimate=guess.how,
                replaceable=group.kind == "op",
            )
        )
    return variants
