"""The GPU side of `kernelforge export` and `verify`: a program that runs a package's kernels through the runtime's
own launch path (`cast.runtime.KernelRunner`) on torch tensors, beside the original operators.

Why a separate process: a kernel that faults poisons the CUDA context of the process it runs in; the export that
started the check only reads the results file, which is written after every kernel, so a crash names the kernel it
happened in and costs nothing else. compute-sanitizer also runs this program (`launch`), so what it instruments is
exactly the runtime's launch.

    python -m kernelforge_tui.cast.probe check PACKAGE --out RESULT.json [--kernel ID ...] [--no-timing]
    python -m kernelforge_tui.cast.probe launch PACKAGE KERNEL_ID

`check`, per kernel: on the card's stored sets (carried in the package), fresh inputs drawn from the card's
distributions, and the family's stress sets, each input placed at exactly the alignment the guard admits, the guard
must admit the call and the kernel must match the original operator within the card's tolerance; then both are
timed, interleaved, with the L2 flushed before every launch. `launch`: one launch on the card's first set with every
buffer an allocation of its own (run with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so memcheck sees each bound).
Exit codes: 0 done, 2 bad input, 3 a CUDA error (the kernel faulted).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, Field

from kernelforge_tui.cards import stress
from kernelforge_tui.cards.directory import Arrays, draw_inputs
from kernelforge_tui.cards.dtypes import from_storage
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cast.manifest import CastError, KernelEntry, Machine, Package, TensorGuard, read_package
from kernelforge_tui.cast.runtime import aten_call
from kernelforge_tui.gpu.statistics import median_settled, robust_stats, speedup_interval

if TYPE_CHECKING:
    import torch

    from kernelforge_tui.cast.runtime import KernelRunner

FRESH_SEEDS = (7001, 7002, 7003)
MIN_REPS, MAX_REPS, TIMING_BUDGET_S, TARGET_REL_ERROR = 20, 400, 5.0, 0.005
EXIT_DONE, EXIT_USAGE, EXIT_FAULT = 0, 2, 3


class SetOutcome(BaseModel):
    name: str
    ok: bool
    detail: str = ""


class KernelCheck(BaseModel):
    """What `check` found for one kernel."""

    kernel: str
    ok: bool
    reason: str = ""
    sets: list[SetOutcome] = Field(default_factory=list)
    kernel_us: float | None = None
    eager_us: float | None = None
    speedup: float | None = None
    interval: tuple[float, float] | None = None
    reps: int = 0
    timed: bool = False
    faster: bool | None = None


class ProbeResult(BaseModel):
    machine: Machine | None
    kernels: list[KernelCheck] = Field(default_factory=list)


# -- inputs ------------------------------------------------------------------------------------------------------


def card_of(package: Package, entry: KernelEntry) -> OperatorCard:
    return OperatorCard.model_validate_json(package.member(entry.files.card))


def input_sets(
    package: Package, entry: KernelEntry, spec: OperatorCard, fresh: Sequence[int]
) -> Iterator[tuple[str, Arrays]]:
    """(name, inputs): the stored sets the package carries, fresh draws, then the family's stress sets."""
    for name in entry.files.sets:
        with np.load(io.BytesIO(package.member(name)), allow_pickle=False) as data:
            yield (
                Path(name).stem,
                {t.name: from_storage(data[t.name], t.dtype) for t in spec.inputs},
            )
    for seed in fresh:
        yield f"fresh:{seed}", draw_inputs(spec, seed)
    running = stress.running(spec)
    if running:
        base = draw_inputs(spec, spec.stress.seed)
        for planned in running:
            yield planned.label, stress.draw(spec, planned.name, base)


def to_torch(array: np.ndarray) -> torch.Tensor:
    import torch

    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def as_call(array: np.ndarray, guard: TensorGuard) -> torch.Tensor:
    """A card set's array (in the card's shape) as the aten call's tensor: the same elements, row-major, viewed in
    the call's shape with the call's strides (which may differ from torch's own only on dims of size 1), no copy.
    CastError when the array is not the card's shape the guard names."""
    if tuple(array.shape) != guard.kernel_shape:
        raise CastError(
            f"input {guard.name}: the card's set holds {list(array.shape)}, the package's kernel reads "
            f"{list(guard.kernel_shape)}: export it again"
        )
    return to_torch(array).view(guard.shape).as_strided(guard.shape, guard.strides)


def placed(host: torch.Tensor, guard: TensorGuard, device: torch.device, exact: bool = False) -> torch.Tensor:
    """`host` (in the call's shape) on the device at exactly the guard's alignment: the weakest the guard admits, so
    that is what is proven. `exact`: the tensor ends where its allocation ends (memcheck sees a read or write past
    the end); otherwise 512 bytes of slack follow it."""
    import torch

    if tuple(host.shape) != guard.shape:
        raise CastError(f"input {guard.name}: {list(host.shape)} is not the call's shape {list(guard.shape)}")
    nbytes = host.numel() * host.element_size()
    offset = guard.alignment % 256  # 256 and more: torch's own (512-byte) alignment is admitted as it is
    size = offset + nbytes + (0 if exact else 512)
    buffer = torch.empty(size, dtype=torch.uint8, device=device)
    start = offset
    if buffer.data_ptr() % 256:  # a host allocator (64 bytes); CUDA's start at 256 or more, so `exact` holds there
        buffer = torch.empty(size + 256, dtype=torch.uint8, device=device)
        # The next 256-byte boundary; where this buffer starts on one, the one after (then it still ends at the end).
        start = (-buffer.data_ptr() % 256 or 256) + offset
    view = buffer[start : start + nbytes].view(host.dtype).as_strided(guard.shape, guard.strides)
    view.copy_(host)
    return view


def call_inputs(
    entry: KernelEntry, arrays: Arrays, device: torch.device, exact: bool = False
) -> dict[str, torch.Tensor]:
    """The call's input tensors from one of the card's sets: in the call's shapes, each placed at the guard's
    alignment (`placed`)."""
    return {g.name: placed(as_call(arrays[g.name], g), g, device, exact) for g in entry.guard.inputs}


# -- check -------------------------------------------------------------------------------------------------------


def in_float64(op: Any, args: list[Any], kwargs: dict[str, Any]) -> list[torch.Tensor] | None:
    """The captured call re-run with its floating tensors in float64 (the card's reference does the same on the
    CPU): what is right where eager's own 16-bit rounding is not (CUDA's bf16 group norm rounds its statistics to
    bf16 first, which on large-mean groups moves y past the tolerance). None where the op has no float64 kernel."""
    import torch

    def wide(value: Any) -> Any:
        return value.to(torch.float64) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    try:
        result = op(*[wide(a) for a in args], **{k: wide(v) for k, v in kwargs.items()})
    except (RuntimeError, TypeError):
        return None
    return list(result) if isinstance(result, tuple | list) else [result]


def check_kernel(
    package: Package, runner: KernelRunner, timing: bool, fresh: Sequence[int], device: torch.device | None = None
) -> KernelCheck:
    """Agreement with eager on every set (and the timing); `device`: the current CUDA device unless given."""
    import torch

    from kernelforge_tui.cast.runtime import disagreement

    entry = runner.entry
    spec = card_of(package, entry)
    device = device or torch.device("cuda", torch.cuda.current_device())
    result = KernelCheck(kernel=entry.id, ok=True)
    first: tuple[Any, list[Any], dict[str, Any], list[torch.Tensor]] | None = None
    for name, arrays in input_sets(package, entry, spec, fresh):
        tensors = call_inputs(entry, arrays, device)
        op, args, kwargs = aten_call(entry, tensors)
        admitted = runner.check(args, kwargs)
        if isinstance(admitted, str):
            result.ok, result.reason = False, f"set {name}: the guard refuses the very call it was made for: {admitted}"
            return result
        eager = op(*args, **kwargs)
        ours = runner.launch(admitted)
        if device.type == "cuda":
            torch.cuda.synchronize()
        refs: list[torch.Tensor] = [eager] if runner.single else list(eager)
        outs: list[torch.Tensor] = list(ours) if isinstance(ours, tuple) else [ours]
        problems = [
            f"{g.name}: {p}"
            for g, out, ref in zip(entry.guard.outputs, outs, refs, strict=True)
            if (p := disagreement(out, ref, entry.tolerances[g.name]))
        ]
        detail = "; ".join(problems)
        exact = in_float64(op, args, kwargs) if problems else None
        if exact is not None:  # eager's own rounding (a 16-bit op's statistics) or ours: the exact op decides
            problems = [
                f"{g.name}: {p}"
                for g, out, ref in zip(entry.guard.outputs, outs, exact, strict=True)
                if (p := disagreement(out, ref.to(out.dtype), entry.tolerances[g.name]))
            ]
            if not problems:
                detail = f"agrees with the op in float64 where eager in its dtype does not ({detail})"
        result.sets.append(
            SetOutcome(name=name, ok=not problems, detail=detail if not problems else "; ".join(problems))
        )
        if problems:
            result.ok, result.reason = False, f"set {name}: disagrees with eager PyTorch: {'; '.join(problems)}"
            return result
        if first is None:
            first = (op, args, kwargs, admitted)
    if timing and first is not None:
        time_kernel(runner, *first, result)
    return result


def time_kernel(
    runner: KernelRunner, op: Any, args: list[Any], kwargs: dict[str, Any], admitted: list[Any], result: KernelCheck
) -> None:
    """The kernel and the original operator, interleaved, CUDA events around each, the L2 flushed before each."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    flush_bytes = max(256 << 20, 4 * int(getattr(props, "L2_cache_size", 64 << 20)))
    scratch = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
    new_event: Callable[..., Any] = torch.cuda.Event
    calls: dict[str, Callable[[], object]] = {
        "kernel": lambda: runner.launch(admitted),
        "eager": lambda: op(*args, **kwargs),
    }
    for call in calls.values():
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {"kernel": [], "eager": []}
    started = time.perf_counter()
    while True:
        events = []
        for i in range(10):
            for name in ("kernel", "eager") if i % 2 == 0 else ("eager", "kernel"):
                scratch.zero_()
                begin, end = new_event(enable_timing=True), new_event(enable_timing=True)
                begin.record()
                calls[name]()
                end.record()
                events.append((name, begin, end))
        torch.cuda.synchronize()
        for name, begin, end in events:
            samples[name].append(begin.elapsed_time(end) * 1000.0)
        reps = len(samples["kernel"])
        settled = all(median_settled(s, TARGET_REL_ERROR) for s in samples.values())
        if reps >= MAX_REPS or time.perf_counter() - started > TIMING_BUDGET_S or (reps >= MIN_REPS and settled):
            break
    kernel, eager = robust_stats(samples["kernel"]), robust_stats(samples["eager"])
    low, high = speedup_interval(kernel, eager)
    result.timed = True
    result.kernel_us, result.eager_us = kernel.median_us, eager.median_us
    result.speedup = eager.median_us / kernel.median_us
    result.interval = (low, high)
    result.reps = reps
    result.faster = low > 1.0


COPY_BYTES = 256 << 20
"""Bytes a copy-ceiling measurement copies: over four times the H200's 60 MB L2, so the copy streams from DRAM."""


def copy_gbps(copies: int = 10) -> float:
    """The device-to-device copy ceiling of torch's current GPU (bytes read plus written per second, GB/s): the
    fastest of `copies` copies of COPY_BYTES timed with CUDA events, after one untimed."""
    import torch

    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    target.copy_(source)
    new_event: Callable[..., Any] = torch.cuda.Event
    best = float("inf")
    for _ in range(copies):
        start, end = new_event(enable_timing=True), new_event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)
    return 2 * COPY_BYTES / best / 1e9


def check(path: Path, out: Path, kernels: Sequence[str], timing: bool, fresh: Sequence[int]) -> int:
    import torch

    from kernelforge_tui.cast.runtime import KernelRunner, probe_machine

    package = read_package(path)
    machine = probe_machine()
    if machine is not None:
        machine = machine.model_copy(update={"copy_gbps": round(copy_gbps(), 1)})
    result = ProbeResult(machine=machine)
    out.write_text(result.model_dump_json())
    for entry in package.manifest.kernels:
        if kernels and entry.id not in kernels:
            continue
        print(f"probe: checking {entry.id}", file=sys.stderr, flush=True)
        try:
            found = check_kernel(package, KernelRunner(package, entry), timing, fresh)
        except torch.cuda.OutOfMemoryError as exc:
            found = KernelCheck(kernel=entry.id, ok=False, reason=f"out of GPU memory: {exc}")
        except CastError as exc:  # the package contradicts itself (its sets against its guard): this kernel only
            found = KernelCheck(kernel=entry.id, ok=False, reason=str(exc))
        except RuntimeError as exc:  # a CUDA error: the context is gone, so stop here
            result.kernels.append(KernelCheck(kernel=entry.id, ok=False, reason=f"CUDA error while it ran: {exc}"))
            out.write_text(result.model_dump_json())
            return EXIT_FAULT
        result.kernels.append(found)
        out.write_text(result.model_dump_json())
    return EXIT_DONE


def sanitizer_call(package: Package, runner: KernelRunner, device: torch.device) -> list[torch.Tensor] | str:
    """The inputs of the one launch compute-sanitizer watches, as the guard admitted them, or why it refused: the
    card's first set in the call's shapes, each input its own allocation, at exactly the guard's alignment and
    ending where its allocation ends."""
    entry = runner.entry
    spec = card_of(package, entry)
    _, arrays = next(input_sets(package, entry, spec, FRESH_SEEDS[:1]))
    _, args, kwargs = aten_call(entry, call_inputs(entry, arrays, device, exact=True))
    return runner.check(args, kwargs)


def _where(tensors: Sequence[torch.Tensor], names: Sequence[str]) -> str:
    """Each tensor's address range and its allocation's, to read a memcheck report's addresses against."""
    parts = []
    for name, t in zip(names, tensors, strict=True):
        start, nbytes = t.data_ptr(), t.numel() * t.element_size()
        storage = t.untyped_storage()
        parts.append(
            f"{name} {list(t.shape)} at {start:#x}-{start + nbytes:#x} ({nbytes} bytes; allocation "
            f"{storage.data_ptr():#x}-{storage.data_ptr() + storage.nbytes():#x})"
        )
    return "; ".join(parts)


def launch(path: Path, kernel: str) -> int:
    """One launch on the card's first set, for compute-sanitizer."""
    import torch

    from kernelforge_tui.cast.runtime import KernelRunner

    package = read_package(path)
    entries = [e for e in package.manifest.kernels if e.id == kernel]
    if not entries:
        print(f"probe: no kernel {kernel!r} in {path}", file=sys.stderr)
        return EXIT_USAGE
    entry = entries[0]
    runner = KernelRunner(package, entry)
    device = torch.device("cuda", torch.cuda.current_device())
    admitted = sanitizer_call(package, runner, device)
    if isinstance(admitted, str):
        print(f"probe: the guard refuses the call: {admitted}", file=sys.stderr)
        return EXIT_USAGE
    try:
        outs = runner.launch(admitted)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        print(f"probe: the kernel faulted: {exc}", file=sys.stderr)
        return EXIT_FAULT
    results = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    names = [g.name for g in entry.guard.inputs] + [g.name for g in entry.guard.outputs]
    plan = entry.launch
    print(
        f"probe: launched {plan.entry} once (grid {plan.grid}, block {plan.block}, "
        f"{plan.shared_bytes} bytes of dynamic shared memory): {_where([*admitted, *results], names)}",
        file=sys.stderr,
    )
    return EXIT_DONE


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelforge_tui.cast.probe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check")
    chk.add_argument("package", type=Path)
    chk.add_argument("--out", type=Path, required=True)
    chk.add_argument("--kernel", action="append", default=[])
    chk.add_argument("--no-timing", action="store_true")
    lau = sub.add_parser("launch")
    lau.add_argument("package", type=Path)
    lau.add_argument("kernel")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            return check(args.package, args.out, args.kernel, not args.no_timing, FRESH_SEEDS)
        return launch(args.package, args.kernel)
    except CastError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
