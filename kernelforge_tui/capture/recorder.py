"""The torch side of capture: forward passes of the user's model under a TorchDispatchMode.

Why several passes, each doing one thing: recording metadata and dataflow (pass A) costs host time, cloning sampled
tensors (pass B) costs memory traffic, and either would distort the timing (pass C), which wraps each call in a
profiler range and nothing else. The passes must see the same sequence of aten calls (a deterministic forward
pass); a model whose operator sequence changes between two runs is refused with the first call that differs.

Timing: on CUDA, torch.profiler (CUPTI) attributes every kernel to the aten call that launched it, so a call's time
is its kernels' device time, unaffected by the hook's host overhead; when the profiler reports no device time (no
CUPTI), each call is timed with CUDA events around it and a synchronisation (host launch latency included, said so
in the manifest). On the CPU, each call's wall time (`perf_counter_ns`) is its time: CPU time, not a GPU's.

This module imports torch; nothing imports it but `capture.run`, and only when a capture runs.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelforge_tui.capture.calls import Call, link
from kernelforge_tui.capture.loader import Built, RecorderBug, UserCodeError, run_model
from kernelforge_tui.capture.manifest import ArgSpec, TensorMeta, Timing
from kernelforge_tui.errors import BadInput

Handler = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]


class _Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Hands every aten call to a handler, which runs it (`func(*args, **kwargs)`) and returns its result."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.handler = handler

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return self.handler(func, args, kwargs or {})


class SequenceChanged(BadInput):
    """The model ran other aten calls on a later forward pass than on the first."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def alignment(t: torch.Tensor) -> int:
    ptr = int(t.data_ptr())
    return 256 if ptr == 0 else min(256, ptr & -ptr)


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(
        shape=[int(d) for d in t.shape],
        stride=[int(s) for s in t.stride()],
        dtype=dtype_name(t.dtype),
        device=str(t.device),
        contiguous=bool(t.is_contiguous()),
        storage_offset=int(t.storage_offset()),
        alignment=alignment(t),
    )


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def arg_specs(
    args: tuple[Any, ...], kwargs: dict[str, Any], source: Callable[[torch.Tensor], tuple[int, int]]
) -> list[ArgSpec]:
    specs: list[ArgSpec] = []

    def add(path: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            specs.append(ArgSpec(path=path, kind="tensor", tensor=tensor_meta(value), source=source(value)))
        elif value is None:
            specs.append(ArgSpec(path=path, kind="none"))
        elif isinstance(value, float) and not math.isfinite(value):
            specs.append(ArgSpec(path=path, kind="float", value=str(value)))
        elif isinstance(value, (bool, int, float, str)):
            specs.append(ArgSpec(path=path, kind="scalar", value=value))
        elif isinstance(value, torch.dtype):
            specs.append(ArgSpec(path=path, kind="dtype", value=dtype_name(value)))
        elif isinstance(value, torch.device):
            specs.append(ArgSpec(path=path, kind="device", value=str(value)))
        elif isinstance(value, torch.layout):
            specs.append(ArgSpec(path=path, kind="layout", value=str(value).removeprefix("torch.")))
        elif isinstance(value, torch.memory_format):
            specs.append(ArgSpec(path=path, kind="memory_format", value=str(value).removeprefix("torch.")))
        elif isinstance(value, (list, tuple)):
            items = list(value)
            if all(_scalar(v) and not (isinstance(v, float) and not math.isfinite(v)) for v in items):
                specs.append(ArgSpec(path=path, kind="scalar", value=items))
            else:
                specs.append(ArgSpec(path=path, kind="list", value=len(items)))
                for j, item in enumerate(items):
                    add(f"{path}[{j}]", item)
        else:
            specs.append(ArgSpec(path=path, kind="other", value=repr(value)[:200]))

    for i, arg in enumerate(args):
        add(f"args[{i}]", arg)
    for key, arg in kwargs.items():
        add(f"kwargs.{key}", arg)
    return specs


def _flat(out: object) -> list[object]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _tensors(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _schema_flags(func: Any) -> tuple[bool, bool]:
    """(in place, view) from the overload's schema: an argument it writes; a result aliasing an input."""
    schema = func._schema
    inplace = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return inplace, bool(getattr(func, "is_view", False))


class Dataflow:
    """Which call produced each live tensor: (call, output), or (-k, 0) for the k-th tensor from outside."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], tuple[int, int]]] = {}
        self._external = 0

    def source(self, t: torch.Tensor) -> tuple[int, int]:
        entry = self._seen.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        self._external += 1
        where = (-self._external, 0)
        self._seen[id(t)] = (weakref.ref(t), where)
        return where

    def produced(self, t: torch.Tensor, call: int, out: int) -> None:
        self._seen[id(t)] = (weakref.ref(t), (call, out))

    def lookup(self, t: torch.Tensor) -> tuple[int, int] | None:
        entry = self._seen.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None


def _guarded(fn: Callable[[], Any]) -> Any:
    """Our own code inside the hook: an error there is kernelforge's, kept apart from the model's."""
    try:
        return fn()
    except Exception as exc:
        raise RecorderBug(exc) from exc


def _forward(built: Built, model_file: Path, handler: Handler | None) -> object:
    with torch.no_grad():
        if handler is None:
            return run_model(built, model_file)
        with _Mode(handler):
            return run_model(built, model_file)


def record(built: Built, model_file: Path) -> list[Call]:
    """Pass A: every aten call of one forward pass, with its arguments, results and dataflow."""
    calls: list[Call] = []
    flow = Dataflow()

    def handler(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        specs = _guarded(lambda: arg_specs(args, kwargs, flow.source))
        out = func(*args, **kwargs)

        def note() -> None:
            index = len(calls)
            flat = _flat(out)
            metas = [tensor_meta(o) if isinstance(o, torch.Tensor) else None for o in flat]
            for k, o in enumerate(flat):
                if isinstance(o, torch.Tensor):
                    flow.produced(o, index, k)
            inplace, view = _schema_flags(func)
            calls.append(Call(index=index, op=str(func), args=specs, outputs=metas, inplace=inplace, view=view))

        _guarded(note)
        return out

    result = _forward(built, model_file, handler)
    link(calls)
    for t in _tensors(result):
        where = flow.lookup(t)
        if where is not None and where[0] >= 0:
            calls[where[0]].model_outputs.add(where[1])
    return calls


class _Sequence:
    """Checks that a later pass runs the calls of pass A in the same order."""

    def __init__(self, calls: list[Call]) -> None:
        self.calls = calls
        self.index = 0

    def next(self, func: Any) -> int:
        index = self.index
        op = str(func)
        if index >= len(self.calls) or self.calls[index].op != op:
            expected = self.calls[index].op if index < len(self.calls) else "the end of the pass"
            raise SequenceChanged(
                f"the model ran {op} as aten call {index} where the first forward pass ran {expected}: capture needs a "
                "forward pass that runs the same operators every time (no randomness in control flow)"
            )
        self.index += 1
        return index

    def finish(self) -> None:
        if self.index != len(self.calls):
            raise SequenceChanged(
                f"the model ran {self.index} aten calls where the first forward pass ran {len(self.calls)}: capture "
                "needs a forward pass that runs the same operators every time"
            )
        self.index = 0


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host copy; bf16 through fp32 (exact) to ml_dtypes' bfloat16, as cards store it."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return np.ascontiguousarray(t.to("cpu", torch.float32).numpy().astype(ml_dtypes.bfloat16))
    return np.array(t.to("cpu").contiguous().numpy(), copy=True)


def _at(args: tuple[Any, ...], kwargs: dict[str, Any], path: str) -> object:
    if path.startswith("kwargs."):
        return kwargs[path.removeprefix("kwargs.")]
    value: object = args
    for part in path.removeprefix("args").strip("[]").split("]["):
        value = value[int(part)]  # type: ignore[index]
    return value


@dataclass(frozen=True)
class Tap:
    """One tensor to copy during pass B: at call `call`, argument `path` (role input) or output `out`."""

    call: int
    role: str
    path: str
    out: int
    key: tuple[int, int]
    """(group, instance) the copy belongs to."""
    name: str
    card_shape: tuple[int, ...]
    order: tuple[int, ...] = ()
    """The call's dims in memory order where that is not row-major (a transposed view, channels-last): the tensor is
    copied permuted by it, as it lies in memory."""


def sample(
    built: Built, model_file: Path, calls: list[Call], taps: list[Tap]
) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """Pass B: host copies of the tapped inputs (before the call) and outputs (after it), reshaped to the card."""
    by_call: dict[int, list[Tap]] = {}
    for tap in taps:
        by_call.setdefault(tap.call, []).append(tap)
    found: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    sequence = _Sequence(calls)

    def keep(tap: Tap, value: object) -> None:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"call {tap.call} {tap.path or tap.out}: expected a tensor, got {type(value).__name__}")
        stored = value.permute(tap.order) if tap.order else value
        found.setdefault(tap.key, {})[tap.name] = to_numpy(stored).reshape(tap.card_shape)

    def handler(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        index = sequence.next(func)
        mine = by_call.get(index, [])

        def before() -> None:
            for tap in mine:
                if tap.role == "input":
                    keep(tap, _at(args, kwargs, tap.path))

        _guarded(before)
        out = func(*args, **kwargs)

        def after() -> None:
            for tap in mine:
                if tap.role == "output":
                    keep(tap, _flat(out)[tap.out])

        _guarded(after)
        return out

    _forward(built, model_file, handler)
    sequence.finish()
    return found


@dataclass
class Timings:
    per_call_us: list[float]
    """Each call's time in one forward pass (the mean over the timed passes)."""
    method: Timing
    note: str
    repeats: int
    forward_wall_us: float
    copy_gbps: float | None = None
    device_name: str = "cpu"
    capability: str | None = None
    extra: dict[str, float] = field(default_factory=dict)


def _cpu_times(built: Built, model_file: Path, calls: list[Call], repeats: int) -> list[float]:
    totals = [0.0] * len(calls)
    sequence = _Sequence(calls)

    def handler(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        index = sequence.next(func)
        begin = time.perf_counter_ns()
        out = func(*args, **kwargs)
        totals[index] += (time.perf_counter_ns() - begin) / 1e3
        return out

    for _ in range(repeats):
        _forward(built, model_file, handler)
        sequence.finish()
    return [t / repeats for t in totals]


def _profiler_times(built: Built, model_file: Path, calls: list[Call], repeats: int) -> list[float]:
    from torch.profiler import ProfilerActivity, profile, record_function

    sequence = _Sequence(calls)

    def handler(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        index = sequence.next(func)
        with record_function(f"kf#{index}"):
            return func(*args, **kwargs)

    with warnings.catch_warnings():
        # One profiling cycle, all of whose events are read: torch 2.11 (the H200's) warns that events are cleared "at
        # the end of each cycle" even without a schedule, which says nothing about this capture (fixed upstream in
        # pytorch/pytorch#180387).
        warnings.filterwarnings("ignore", message=r".*Profiler clears events at the end of each cycle")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                _forward(built, model_file, handler)
                sequence.finish()
            torch.cuda.synchronize()
    totals = [0.0] * len(calls)
    for event in prof.events():
        on_cpu = getattr(event.device_type, "name", "") == "CPU"  # the range itself, not its GPU-side annotation
        if event.name.startswith("kf#") and on_cpu:
            totals[int(event.name[3:])] += float(event.device_time_total)
    return [t / repeats for t in totals]


def _event_times(built: Built, model_file: Path, calls: list[Call], repeats: int) -> list[float]:
    totals = [0.0] * len(calls)
    sequence = _Sequence(calls)

    def handler(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        index = sequence.next(func)
        begin, end = _event(), _event()
        torch.cuda.synchronize()
        begin.record()
        out = func(*args, **kwargs)
        end.record()
        end.synchronize()
        totals[index] += begin.elapsed_time(end) * 1e3
        return out

    for _ in range(repeats):
        _forward(built, model_file, handler)
        sequence.finish()
    return [t / repeats for t in totals]


def _event() -> Any:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def _wall_us(built: Built, model_file: Path, cuda: bool, repeats: int) -> float:
    times = []
    for _ in range(max(3, repeats)):
        if cuda:
            torch.cuda.synchronize()
        begin = time.perf_counter_ns()
        _forward(built, model_file, None)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter_ns() - begin) / 1e3)
    return float(statistics.median(times))


def copy_bandwidth_gbps(device: torch.device, mib: int = 256) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), median of 10 copies of `mib` MiB."""
    src = torch.empty(mib << 18, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        begin, end = _event(), _event()
        begin.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    del src, dst
    return float(2 * (mib << 20) / statistics.median(times) / 1e9)


def time_calls(built: Built, model_file: Path, calls: list[Call], device: str, repeats: int) -> Timings:
    """Pass C: each call's time in one forward pass, the eager forward's wall time, and (CUDA) the copy ceiling."""
    cuda = device.startswith("cuda")
    if not cuda:
        per_call = _cpu_times(built, model_file, calls, repeats)
        return Timings(
            per_call_us=per_call,
            method="cpu-wall",
            note="CPU time of each aten call (perf_counter_ns around it): shares of the model's CPU time, not of a "
            "GPU's; capture on the GPU (--device cuda) for GPU shares",
            repeats=repeats,
            forward_wall_us=_wall_us(built, model_file, False, repeats),
        )
    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    per_call = _profiler_times(built, model_file, calls, repeats)
    method: Timing = "cuda-profiler"
    note = (
        "device time of each aten call's kernels (torch.profiler, CUPTI), mean over the timed passes: the share of "
        "the model's eager GPU time"
    )
    if sum(per_call) <= 0:
        per_call = _event_times(built, model_file, calls, repeats)
        method = "cuda-events"
        note = (
            "CUDA events around each aten call with a synchronisation before it (the profiler reported no device "
            "time): host launch latency is included, so small calls look longer than their kernels"
        )
    return Timings(
        per_call_us=per_call,
        method=method,
        note=note,
        repeats=repeats,
        forward_wall_us=_wall_us(built, model_file, True, repeats),
        copy_gbps=copy_bandwidth_gbps(dev),
        device_name=str(props.name),
        capability=f"{props.major}.{props.minor}",
    )


def resolve_device(requested: str | None) -> str:
    """`cuda` or `cpu` as asked (cuda when there is one, by default); BadInput for cuda without a GPU."""
    if requested in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested is not None and requested.startswith("cuda") and not torch.cuda.is_available():
        from kernelforge_tui.errors import NoGpu

        raise NoGpu("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False); use --device cpu")
    return str(requested)


def warm_up(built: Built, model_file: Path, device: str) -> None:
    """Two eager forward passes without the hook: the user's own errors surface here as they would without us, and
    one-time work (cuDNN autotuning, lazy initialisation) is done before anything is measured."""
    for _ in range(2):
        _forward(built, model_file, None)
    if device.startswith("cuda"):
        torch.cuda.synchronize()


__all__ = [
    "SequenceChanged",
    "Tap",
    "Timings",
    "UserCodeError",
    "record",
    "resolve_device",
    "sample",
    "time_calls",
    "warm_up",
]
