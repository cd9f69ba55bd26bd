"""Benchmark (not a test): a .cast package end to end on the GPU.

Exports a package from a run (a softmax or rms_norm card's search) or from a capture directory and its runs, with
every check (`kernelforge export`), loads it, and in one process:
- runs the op (run mode: the exact captured call, fresh inputs each time) or the model's forward pass (capture mode:
  the model file rebuilt, its floating inputs redrawn each time) many times with the package loaded, comparing every
  output with eager PyTorch (the package's tolerance for an op; bf16/fp16/fp32 assert_close defaults and the largest
  difference for a model);
- times eager, the package and torch.compile of the same op or model, interleaved in rounds (CUDA events and
  synchronised wall clock per call, the host's enqueue time of each, and forwards back to back with no sync between
  them, as the layers of a model run; no L2 flush: end to end, as a model runs);
- times operators the package does not override with it active and not (does an active package slow the others?);
- profiles the model's GPU kernels per forward, eager and with the package (torch.profiler): the kernel's time on the
  model's own data, what else moved, and how long the GPU waited;
- measures the host time per call, the parts taking turns window by window: eager's; the package's through the
  dispatcher; the floor of any torch.library override; the hot path's guard, output allocation, current stream,
  driver call and launch; the full guard; and a call the guard refuses (the same call in float32), on a Cast of
  its own so that its calls are not counted as the model's;
- counts hits and fallbacks (the model's: the comparison with eager and the end-to-end timing);
and writes cast_report.json and cast_report.md to OUT.

`--micro` measures the hot path on the CPU, no GPU (`micro`): the decoder's softmax guard registered for the CPU key
and the runtime's own ctypes launch into a C stand-in of the driver's launch function; cast_micro.json and .md.

    python bench/cast_gpu.py --run examples/runs/softmax_bf16 --out bench/results/cast_softmax
    python bench/cast_gpu.py --capture CAPTURE_DIR [--runs DIR] --out bench/results/cast_decoder
    python bench/cast_gpu.py --package model.cast --capture CAPTURE_DIR --out ...   (skip the export)
    python bench/cast_gpu.py --micro --out bench/results/cast_micro
    python bench/cast_gpu.py --run examples/runs/softmax_bf16 --host-only --out ...   (host time per call only)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from kernelforge_tui.cast import load
from kernelforge_tui.cast.export import export
from kernelforge_tui.cast.manifest import CastManifest, KernelEntry, read_package
from kernelforge_tui.cast.probe import as_call, card_of, input_sets
from kernelforge_tui.cast.runtime import Cast, aten_call, disagreement, probe_machine

ROOT = Path(__file__).resolve().parent.parent


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- workloads ---------------------------------------------------------------------------------------------------


class Workload:
    """What runs: `forward()` with the current inputs, `redraw(i)` new inputs, `compiled()` torch.compile's."""

    name: str

    def forward(self) -> Any:
        raise NotImplementedError

    def redraw(self, i: int) -> None:
        raise NotImplementedError

    def compiled(self) -> Callable[[], Any]:
        raise NotImplementedError


class OpWorkload(Workload):
    """One kernel's captured call, on inputs drawn from its card (the stored sets first, then fresh ones)."""

    def __init__(self, package_path: Path, entry: KernelEntry) -> None:
        package = read_package(package_path)
        self.entry = entry
        self.name = f"{entry.guard.describe()}"
        spec = card_of(package, entry)
        self.sets = [arrays for _, arrays in itertools.islice(input_sets(package, entry, spec, range(9001, 9005)), 8)]
        self.redraw(0)

    def redraw(self, i: int) -> None:
        arrays = self.sets[i % len(self.sets)]
        # The card's sets are in the card's shapes ([32768, 1024]); the call takes the op's ([2, 16, 1024, 1024]).
        self.tensors = {g.name: as_call(arrays[g.name], g).cuda() for g in self.entry.guard.inputs}
        self.op, self.args, self.kwargs = aten_call(self.entry, self.tensors)

    def forward(self) -> Any:
        return self.op(*self.args, **self.kwargs)

    def compiled(self) -> Callable[[], Any]:
        op = self.op
        fn = torch.compile(lambda *a, **k: op(*a, **k))
        return lambda: fn(*self.args, **self.kwargs)


def describe_capture(capture_dir: Path) -> str:
    from kernelforge_tui.capture.manifest import load_capture

    manifest = load_capture(capture_dir)
    return f"{manifest.model_file} ({manifest.entry}, {manifest.device})"


class ModelWorkload(Workload):
    """The captured model, rebuilt from its file and entry as `kernelforge capture` built it."""

    def __init__(self, capture_dir: Path) -> None:
        from kernelforge_tui.capture.loader import Entry, build
        from kernelforge_tui.capture.manifest import load_capture

        manifest = load_capture(capture_dir)
        offered: dict[str, object] = {"device": manifest.device, **manifest.entry_kwargs}
        self.built = build(Path(manifest.model_file), Entry.parse(manifest.entry), offered)
        self.name = f"{manifest.model_file} ({manifest.entry}, {manifest.device})"
        self.base = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.built.args]
        self.args = list(self.base)

    def redraw(self, i: int) -> None:
        args: list[Any] = []
        for a in self.base:
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                generator = torch.Generator(device=a.device).manual_seed(1000 + i)
                noise = torch.randn(a.shape, generator=generator, device=a.device, dtype=torch.float32)
                args.append((a.float() + 0.1 * a.float().std() * noise).to(a.dtype))
            else:
                args.append(a)
        self.args = args

    def forward(self) -> Any:
        with torch.no_grad():
            return self.built.model(*self.args, **self.built.kwargs)

    def compiled(self) -> Callable[[], Any]:
        model = torch.compile(self.built.model)

        def run() -> Any:
            with torch.no_grad():
                return model(*self.args, **self.built.kwargs)

        return run


# -- measurements ------------------------------------------------------------------------------------------------


def flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flat(item)]
    return []


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return {torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5)}.get(dtype, (1.3e-6, 1e-5))


def correctness(
    work: Workload, cast: Cast, calls: int, entry: KernelEntry | None, shadow: Cast | None = None
) -> dict[str, Any]:
    """`calls` outputs with the package against eager's on the same inputs. An op's outputs are held to the
    package's tolerance element by element. A model's are held to its dtype's relative tolerance of the output's
    largest magnitude (|ours - eager| <= rtol * (|eager| + max |eager|)): a kernel within its card's tolerance
    changes the next matrix products' inputs by a bf16 rounding, and an output near zero then differs by far more
    than rtol of itself. The op-level check of a model's calls is `shadow` (the package loaded with shadow_every=1),
    over the same inputs again: every kernel call compared with the original operator at its card's tolerance (a
    kernel that disagrees once is disabled and named)."""
    from kernelforge_tui.cast.manifest import Tolerance

    worst_abs, worst_rel, failures, first = 0.0, 0.0, 0, ""
    for i in range(calls):
        work.redraw(i)
        eager = [t.clone() for t in flat(work.forward())]
        with cast:
            ours = flat(work.forward())
        if shadow is not None:
            with shadow:
                work.forward()
        torch.cuda.synchronize()
        for o, e in zip(ours, eager, strict=True):
            if not e.is_floating_point():
                continue
            diff = (o.float() - e.float()).abs()
            finite = torch.isfinite(diff)
            scale = float(e.float().abs()[finite].max()) if finite.any() else 0.0
            if finite.any():
                worst_abs = max(worst_abs, float(diff[finite].max()))
                worst_rel = max(worst_rel, float(diff[finite].max()) / (scale or 1.0))
            if entry is not None:
                name = entry.guard.outputs[0].name
                problem = disagreement(o, e, entry.tolerances[name])
            else:
                rtol, atol = default_tolerance(e.dtype)
                problem = disagreement(o, e, Tolerance(rtol=rtol, atol=max(atol, rtol * scale)))
            if problem:
                failures += 1
                first = first or f"call {i}: {problem}"
    stats = cast.stats()
    checked = shadow.stats() if shadow is not None else None
    return {
        "calls": calls,
        "criterion": "the package's tolerance per element"
        if entry is not None
        else "|diff| <= rtol * (|eager| + max |eager|), rtol of the dtype (bf16 0.016)",
        "outputs_outside_tolerance": failures,
        "first_problem": first,
        "max_abs_diff": worst_abs,
        "max_diff_over_max_eager": worst_rel,
        "hits": stats.hits,
        "fallbacks": stats.fallbacks,
        "shadow_checks": sum(k.shadow_checks for k in checked.kernels) if checked else 0,
        "disabled": {k.kernel: k.disabled for k in checked.kernels if k.disabled} if checked else {},
    }


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_us": statistics.median(ordered),
        "p10_us": ordered[int(0.1 * (len(ordered) - 1))],
        "p90_us": ordered[int(0.9 * (len(ordered) - 1))],
        "n": len(ordered),
    }


Part = tuple[Callable[[], Any], Callable[[], Any] | None]
"""A thing to time per call, and what to hold it in (a context manager's factory: a loaded package, a
registration), or None."""


def time_modes(modes: dict[str, Part], rounds: int, per_round: int, warmup: int = 5) -> dict[str, Any]:
    """Each mode's forward (held in its context, where it has one) timed in interleaved rounds, the order turned
    every other round: per call CUDA events (device), synchronised wall clock (wall) and the time to return
    (host: what the host spends enqueueing), then `per_round` forwards back to back with no sync between them, as
    the layers of a model run. Warm-up first (torch.compile's compilation, a graph's capture)."""
    for fn, hold in modes.values():
        with hold() if hold is not None else contextlib.nullcontext():
            for _ in range(warmup):
                fn()
    torch.cuda.synchronize()
    device: dict[str, list[float]] = {name: [] for name in modes}
    wall: dict[str, list[float]] = {name: [] for name in modes}
    host: dict[str, list[float]] = {name: [] for name in modes}
    stream: dict[str, list[float]] = {name: [] for name in modes}
    new_event: Callable[..., Any] = torch.cuda.Event
    for r in range(rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        for name in order:
            fn, hold = modes[name]
            with hold() if hold is not None else contextlib.nullcontext():
                for _ in range(per_round):
                    torch.cuda.synchronize()
                    begin, end = new_event(enable_timing=True), new_event(enable_timing=True)
                    started = time.perf_counter()
                    begin.record()
                    fn()
                    host[name].append((time.perf_counter() - started) * 1e6)  # enqueued: the host's share
                    end.record()
                    torch.cuda.synchronize()
                    wall[name].append((time.perf_counter() - started) * 1e6)
                    device[name].append(begin.elapsed_time(end) * 1000.0)
                torch.cuda.synchronize()
                begin, end = new_event(enable_timing=True), new_event(enable_timing=True)
                begin.record()
                for _ in range(per_round):
                    fn()
                end.record()
                torch.cuda.synchronize()
                stream[name].append(begin.elapsed_time(end) * 1000.0 / per_round)
    return {
        name: {
            "device": summary(device[name]),
            "wall": summary(wall[name]),
            "host": summary(host[name]),
            "back_to_back": summary(stream[name]),
        }
        for name in modes
    }


def end_to_end(work: Workload, cast: Cast, rounds: int, per_round: int) -> dict[str, Any]:
    """Eager, the package and torch.compile, interleaved per round (`time_modes`)."""
    work.redraw(0)
    say("compiling with torch.compile (the package not loaded)")
    compiled = work.compiled()
    modes: dict[str, Part] = {
        "eager": (work.forward, None),
        "cast": (work.forward, lambda: cast),
        "compile": (compiled, None),
    }
    result = time_modes(modes, rounds, per_round)
    for name in ("cast", "compile"):
        for kind in ("device", "wall", "back_to_back"):
            result[f"{name}_speedup_{kind}"] = result["eager"][kind]["median_us"] / result[name][kind]["median_us"]
    return result


def bystanders(cast: Cast, calls: int = 200, windows: int = 20) -> dict[str, float]:
    """Host time of ops the package does not override (a small add, a small softmax of another shape), with the
    package active and not, interleaved: whether an active package slows the model's other operators."""
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)

    def add() -> Any:
        return torch.add(x, x)

    def softmax() -> Any:
        return torch.softmax(x, dim=-1)

    times: dict[str, list[float]] = {}
    for w in range(windows):
        for active in (False, True) if w % 2 == 0 else (True, False):
            if active:
                cast.activate()
            try:
                for name, fn in (("add", add), ("softmax", softmax)):
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    spent = (time.perf_counter() - started) * 1e6 / calls
                    times.setdefault(f"{name}_{'cast' if active else 'eager'}_us", []).append(spent)
            finally:
                cast.deactivate()
    torch.cuda.synchronize()
    return {name: sorted(values)[len(values) // 2] for name, values in times.items()}


def profiled(work: Workload, cast: Cast, activity: str, forwards: int) -> dict[str, Any]:
    """torch.profiler over `forwards` forward passes (after three to warm up) of `activity` (CPU or CUDA), eager and
    with the package: the profile of each mode."""
    from torch.profiler import ProfilerActivity, profile

    work.redraw(0)
    profiles: dict[str, Any] = {}
    for mode in ("eager", "cast"):
        hold = cast if mode == "cast" else contextlib.nullcontext()
        with hold:
            for _ in range(3):
                work.forward()
            torch.cuda.synchronize()
            with profile(activities=[getattr(ProfilerActivity, activity)]) as prof:
                for _ in range(forwards):
                    work.forward()
                torch.cuda.synchronize()
        profiles[mode] = prof
    return profiles


def host_profile(work: Workload, cast: Cast, forwards: int = 20) -> dict[str, dict[str, float]]:
    """Host time by operator per forward (torch.profiler's CPU self time, us), eager and with the package: which
    operators' host time moved when the package is active (the profiler's own cost is in both)."""
    return {
        mode: {event.key: event.self_cpu_time_total / forwards for event in prof.key_averages()}
        for mode, prof in profiled(work, cast, "CPU", forwards).items()
    }


def kernel_profile(work: Workload, cast: Cast, forwards: int = 10) -> dict[str, Any]:
    """The GPU kernels of a forward pass, eager and with the package (torch.profiler, CUPTI: the package's launches
    through the driver are seen too): microseconds per forward by kernel name, and their sum (the GPU's busy time;
    the end-to-end device median less it is time the GPU waited, for the host or between launches). Says whether
    the kernel is as fast inside the model, on the model's data, as in the package's check, and what else moved."""
    from torch._C._autograd import DeviceType

    result: dict[str, Any] = {"forwards": forwards}
    for mode, prof in profiled(work, cast, "CUDA", forwards).items():
        per_kernel: dict[str, float] = {}
        for event in prof.events():
            if getattr(event, "device_type", None) != DeviceType.CUDA:
                continue
            per_kernel[event.name] = per_kernel.get(event.name, 0.0) + event.time_range.elapsed_us() / forwards
        result[mode] = {"kernels_us": per_kernel, "busy_us": sum(per_kernel.values())}
    return result


def interleaved(parts: dict[str, Part], calls: int, windows: int, sync: bool = True) -> dict[str, float]:
    """Host time per call of each part: windows of `calls` calls queued without a sync (fewer than the launch queue
    holds), the parts taking turns window by window so that a busy spell of the machine falls on all of them, and
    each part's best window (the least disturbed)."""
    best = dict.fromkeys(parts, math.inf)
    for _ in range(windows):
        for name, (fn, hold) in parts.items():
            with hold() if hold is not None else contextlib.nullcontext():
                if sync:
                    torch.cuda.synchronize()
                started = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - started) / calls * 1e6)
                if sync:
                    torch.cuda.synchronize()
    return best


@contextlib.contextmanager
def python_kernel(op: Any, kernel: Callable[..., Any], key: str) -> Iterator[None]:
    """`kernel` registered through torch.library for `op` on dispatch key `key`, for the `with` block. No package
    may be active (it holds the same registration)."""
    import warnings

    make_library: Callable[..., Any] = torch.library.Library
    library = make_library("aten", "IMPL")
    name = op._schema.name.split("::", 1)[1] + ("" if op._overloadname == "default" else f".{op._overloadname}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": on purpose
        library.impl(name, kernel, key, with_keyset=True)
    try:
        yield
    finally:
        library._destroy()


@contextlib.contextmanager
def python_path(cast: Cast) -> Iterator[None]:
    """The package in force with the compiled launcher turned off (every hit through the Python path)."""
    import os

    from kernelforge_tui.cast.launcher import ENV_LAUNCHER

    saved = os.environ.get(ENV_LAUNCHER)
    os.environ[ENV_LAUNCHER] = "off"
    try:
        with cast:
            yield
    finally:
        if saved is None:
            del os.environ[ENV_LAUNCHER]
        else:
            os.environ[ENV_LAUNCHER] = saved


def host_parts(
    cast: Cast, runner: Any, op: Any, args: list[Any], kwargs: dict[str, Any], refused: list[Any], key: str
) -> dict[str, Part]:
    """What `host_times` times, for one kernel's call (`args`, which its guard admits) and a call it refuses:
    - eager: the original operator; cast: the same call with the package loaded (dispatch + guard + launch: the
      compiled launcher's where it is on, `cast.launcher`); python_path: the same with the launcher turned off;
    - round_trip, direct: the floor of any torch.library override (a Python kernel that returns a ready result at
      once, called through the dispatcher, and called directly);
    - the hot path's parts: guard (the call's signature looked up among decided ones, and its pointers against
      the alignment), full_check (`check`, which explains refusals), alloc (the output), stream (torch's current
      one), driver_call (a prepared launch into a ready output: pointers into the argument block and one driver
      call), run (alloc + stream + pointers + driver call), launch (`runner.launch`, run on the first tensor's
      device);
    - refused, eager_refused: the refused call through the package and eagerly."""
    tensors = runner.check(args, kwargs)
    assert not isinstance(tensors, str), f"the guard refuses the call its kernel was made for: {tensors}"
    device = max(tensors[0].get_device(), 0)
    in_pointers = [t.data_ptr() for t in tensors]
    call = tuple(args)
    signature = next(o for o in cast.overrides() if runner in o.by_key.get(runner.key, ())).signature
    decided = {signature(call): (runner, device, runner.fallbacks, "")}
    alignments = runner.alignments

    def guard() -> Any:
        found = decided.get(signature(call))
        return found, [p % a for p, a in zip([t.data_ptr() for t in tensors], alignments, strict=True)]

    out = runner.run(device, tensors, in_pointers)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    launcher = runner.launchers[device]
    pointers = [(outs[i] if is_out else tensors[i]).data_ptr() for is_out, i in runner.order]
    stream = runner._stream(device)
    like, shape, dtype = runner.alloc[0]
    first = tensors[0]
    ready = op(*args, **kwargs)

    def kernel(keyset: Any, *a: Any, **k: Any) -> Any:
        return ready

    return {
        "eager": (lambda: op(*args, **kwargs), None),
        "cast": (lambda: op(*args, **kwargs), lambda: cast),
        "python_path": (lambda: op(*args, **kwargs), lambda: python_path(cast)),
        "round_trip": (lambda: op(*args, **kwargs), lambda: python_kernel(op, kernel, key)),
        "direct": (lambda: kernel(None, *args, **kwargs), None),
        "guard": (guard, None),
        "full_check": (lambda: runner.check(args, kwargs), None),
        "alloc": (
            (lambda: torch.empty_like(tensors[like]))
            if like >= 0
            else (lambda: torch.empty(shape, dtype=dtype, device=first.device)),
            None,
        ),
        "stream": (lambda: runner._stream(device), None),
        "driver_call": (lambda: launcher(stream, pointers), None),
        "run": (lambda: runner.run(device, tensors, in_pointers), None),
        "launch": (lambda: runner.launch(tensors), None),
        "refused": (lambda: op(*refused, **kwargs), lambda: cast),
        "eager_refused": (lambda: op(*refused, **kwargs), None),
    }


def host_times(parts: dict[str, Part], calls: int, windows: int, sync: bool) -> dict[str, Any]:
    t = interleaved(parts, calls, windows, sync)
    return {
        "eager_us": t["eager"],
        "cast_us": t["cast"],
        "python_path_us": t["python_path"],
        "round_trip_us": t["round_trip"] - t["direct"],
        "guard_us": t["guard"],
        "guard_full_check_us": t["full_check"],
        "alloc_us": t["alloc"],
        "stream_us": t["stream"],
        "driver_call_us": t["driver_call"],
        "run_us": t["run"],
        "launch_only_us": t["launch"],
        "dispatch_us": t["python_path"] - t["guard"] - t["run"],
        "refused_call_us": t["refused"],
        "eager_refused_call_us": t["eager_refused"],
        "goal_us": 8.0,
        **({"driver_call_plain_us": t["driver_call_plain"]} if "driver_call_plain" in t else {}),
    }


def host_overhead(package_path: Path, binding: str | None, entry: KernelEntry) -> dict[str, Any]:
    """Per call of one kernel's captured call (`host_parts`), the refused call being the same call in float32 (or
    float64 for a float32 kernel: eager takes it, no kernel covers it).

    On a Cast of its own: its thousands of calls, the refused ones on purpose, are not the model's (the H200's
    first report counted this timing's 3000 float32 calls as the model's fallbacks)."""
    cast = load(package_path, binding=binding)
    work = OpWorkload(package_path, entry)
    op, args, kwargs = work.op, work.args, work.kwargs
    runner = next(r for r in cast.runners if r.entry.id == entry.id)
    admitted = runner.check(args, kwargs)  # the first call on a device goes through the full guard
    assert not isinstance(admitted, str), admitted
    other = {
        name: t.to(torch.float64 if t.dtype == torch.float32 else torch.float32) for name, t in work.tensors.items()
    }
    _, refused, _ = aten_call(entry, other)
    result = host_times(host_parts(cast, runner, op, args, kwargs, refused, "CUDA"), 200, 15, sync=True)
    with cast:  # the launcher the `cast` part had (the last block was the Python path's)
        result["launcher"] = cast.stats().launcher
    result["counters"] = cast.report()
    driver = runner.driver()
    result["binding"] = driver.name
    # Launches cuda-bindings made again inside torch's context: each is several driver calls (should be 0).
    result["launch_retries"] = getattr(driver, "retries", None)
    return result


# -- the hot path on the CPU ---------------------------------------------------------------------------------

FAKE_CUDA = r"""
#include <stdint.h>
static volatile uint64_t sink;
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    sink += (uint64_t)f + gx + gy + gz + bx + by + bz + shared + (uint64_t)stream + **(uint64_t **)params;
    return 0;
}
typedef struct { unsigned gx, gy, gz, bx, by, bz, shared; void *stream; void *attrs; unsigned num_attrs; } config_t;
int cuLaunchKernelEx(const config_t *config, void *f, void **params, void **extra) {
    sink += (uint64_t)f + config->gx + config->bx + config->shared + (uint64_t)config->stream + **(uint64_t **)params;
    return 0;
}
"""


def fake_cuda(directory: Path) -> tuple[Any, str]:
    """The driver's two launch functions with their signatures, reading the argument block and returning success,
    compiled with the C compiler (a launch then costs what ctypes and the argument block cost, nothing of the
    GPU's); Python stand-ins where there is no compiler. ({"extended": RawLaunch, "plain": RawLaunch}, what)."""
    import shutil
    import subprocess

    from kernelforge_tui.cast import driver as drivers

    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is not None:
        source, library = directory / "fake_cuda.c", directory / "libfake_cuda.so"
        source.write_text(FAKE_CUDA)
        built = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], capture_output=True, text=True
        )
        if built.returncode == 0:
            raw = drivers.libcuda_launch([str(library)])
            assert raw is not None and raw.extended
            import ctypes

            plain = ctypes.CDLL(str(library)).cuLaunchKernel
            plain.restype = ctypes.c_int
            both = {"extended": raw, "plain": drivers.RawLaunch(plain, extended=False)}
            return both, f"C stand-ins of cuLaunchKernelEx and cuLaunchKernel ({Path(compiler).name})"

    def stand_in(*args: Any) -> int:
        return 0

    both = {"extended": drivers.RawLaunch(stand_in, True), "plain": drivers.RawLaunch(stand_in, False)}
    return both, "Python stand-ins of the launch functions (no C compiler: the ctypes call is not measured)"


class FakeCudaDriver:
    """The runtime's cuda-bindings launch path (`driver.ctypes_launcher`: the argument block, the stream's launch
    config, one ctypes call) over a stand-in of the driver's launch function."""

    name = "fake cuda"

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def load(self, device: int, image: bytes, entry: str, shared_bytes: int, args: Any) -> Any:
        from kernelforge_tui.cast import driver as drivers

        return drivers._Function(0x7F0000001000, None, None, drivers._Params(args))

    def launcher(self, function: Any, grid: Any, block: Any, shared_bytes: int) -> Any:
        from kernelforge_tui.cast import driver as drivers

        def on_error(error: int, stream: int, pointers: Any) -> None:
            raise RuntimeError(f"stand-in launch failed: {error}")

        return drivers.ctypes_launcher(self.raw, function.handle, grid, block, shared_bytes, function.params, on_error)

    def launch(self, function: Any, grid: Any, block: Any, shared_bytes: int, stream: int, pointers: Any) -> None:
        self.launcher(function, grid, block, shared_bytes)(stream, pointers)

    def function_handle(self, function: Any) -> int:
        return int(function.handle)

    def driver_version(self) -> int:
        return 12080


def micro_package(shape: tuple[int, ...] = (2, 4, 16, 16)) -> Any:
    """An in-memory package whose one kernel has the decoder block's softmax guard (aten::_softmax.default over the
    last axis of a 4-D bf16 tensor, dim -1, half_to_float False, read as the card's [rows, cols]) at a small size:
    the guard's cost does not depend on the sizes, and a small output keeps the CPU allocator's cost near the
    CUDA caching allocator's."""
    from kernelforge_tui.cast.bindings import contiguous_strides
    from kernelforge_tui.cast.manifest import (
        AtenArg,
        CastManifest,
        Guard,
        KernelFiles,
        Latency,
        Launch,
        LaunchArg,
        Package,
        PackageSource,
        Provenance,
        TensorGuard,
        Tolerance,
    )

    rows, cols = math.prod(shape[:-1]), shape[-1]
    tensor = {"shape": shape, "dtype": "bfloat16", "strides": contiguous_strides(shape), "card_shape": (rows, cols)}
    entry = KernelEntry(
        id="k0-micro-softmax",
        variant="micro softmax",
        guard=Guard(
            overload="aten::_softmax.default",
            args=[
                AtenArg(name="arg0", position=0, tensor="x"),
                AtenArg(name="arg1", position=1, accepts=[-1]),
                AtenArg(name="arg2", position=2, accepts=[False]),
            ],
            inputs=[TensorGuard(name="x", alignment=64, **tensor)],  # 64: the CPU allocator's
            outputs=[TensorGuard(name="y", **tensor)],
            capability=(9, 0),
        ),
        launch=Launch(
            entry="kf_softmax",
            grid=(rows, 1, 1),
            block=(64, 1, 1),
            shared_bytes=0,
            args=[
                LaunchArg(kind="tensor", name="x"),
                LaunchArg(kind="tensor", name="y"),
                LaunchArg(kind="scalar", name="rows", scalar_type="int32", value=rows),
                LaunchArg(kind="scalar", name="cols", scalar_type="int32", value=cols),
            ],
        ),
        tolerances={"y": Tolerance(rtol=0.016, atol=1e-5)},
        cubin_arch="sm_90",
        files=KernelFiles(cubin="kernel.cubin", ptx="kernel.ptx", source="kernel.cu", card="card.json", sha256={}),
        latency=Latency(),
        provenance=Provenance(
            run_id="micro",
            run_dir="",
            node_id=0,
            card_name="micro",
            card_sha256="",
            source_sha256="",
            search_gpu="",
        ),
    )
    manifest = CastManifest(
        created_at=time.time(),
        kernelforge_version="micro",
        source=PackageSource(kind="run", path=""),
        kernels=[entry],
        audit=[],
    )
    return Package(Path("micro.cast"), manifest, {"kernel.cubin": b"stand-in"})


def micro(out: Path, windows: int = 100) -> dict[str, Any]:
    """The hot path on the CPU, without a GPU: the decoder's softmax guard (`micro_package`) registered for the CPU
    dispatch key, the runtime's own ctypes launch over C stand-ins of the driver's launch functions (`fake_cuda`).
    What it measures is what a GPU call pays on the host, less the CUDA-only parts: torch's current stream (a C
    call), the caching allocator (CPU: torch's CPU allocator), and the driver's own work inside cuLaunchKernelEx
    (the GPU run's `driver call` has it). Each number is the best of `windows` windows of 1000 calls, the parts
    taking turns (`interleaved`)."""
    import ctypes
    import tempfile

    from kernelforge_tui.cast import launcher as launchers

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        raws, what = fake_cuda(Path(scratch))
        if launchers.load_library() == "":  # the compiled launcher's launches into the C stand-in too
            launchers.hook(int(ctypes.cast(raws["plain"].function, ctypes.c_void_p).value or 0))
        package = micro_package()
        (entry,) = package.manifest.kernels
        x = torch.randn(entry.guard.inputs[0].shape).to(torch.bfloat16)
        op = torch.ops.aten._softmax.default
        args = [x, -1, False]
        refused = [x.float(), -1, False]
        cast = Cast(
            package.path, package, dispatch_key="CPU", device_type="cpu", driver=FakeCudaDriver(raws["extended"])
        )
        (runner,) = cast.runners
        admitted = runner.check(args, {})
        assert not isinstance(admitted, str), admitted
        parts = host_parts(cast, runner, op, args, {}, refused, "CPU")
        plain = FakeCudaDriver(raws["plain"])
        function = plain.load(0, b"", "", 0, entry.launch.args)
        launch_plain = plain.launcher(function, entry.launch.grid, entry.launch.block, entry.launch.shared_bytes)
        pointers = [x.data_ptr(), x.data_ptr()]
        parts["driver_call_plain"] = (lambda: launch_plain(0, pointers), None)
        result: dict[str, Any] = {"launch_stand_in": what, "torch": torch.__version__}
        result.update(host_times(parts, 1000, windows, sync=False))
        with cast:
            result["launcher"] = cast.stats().launcher
        result["counters"] = cast.report()
    out.mkdir(parents=True, exist_ok=True)
    (out / "cast_micro.json").write_text(json.dumps(result, indent=1))
    return result


def micro_markdown(r: dict[str, Any]) -> str:
    rows = [
        ("eager `aten._softmax` (CPU compute included)", r["eager_us"]),
        (
            "torch.library round trip (a Python kernel returning a ready tensor, less calling it directly)",
            r["round_trip_us"],
        ),
        ("through the package (dispatch + guard + run)", r["cast_us"]),
        ("the same with the compiled launcher off (the Python path)", r["python_path_us"]),
        ("guard (the signature's decision looked up, one modulo per pointer)", r["guard_us"]),
        ("full guard (`check`, which explains refusals)", r["guard_full_check_us"]),
        ("output allocation", r["alloc_us"]),
        ("torch's current stream (CPU: none)", r["stream_us"]),
        ("driver call (pointers into the argument block + one ctypes cuLaunchKernelEx)", r["driver_call_us"]),
        ("the same through cuLaunchKernel (11 arguments; drivers before CUDA 12)", r["driver_call_plain_us"]),
        ("run (allocation + stream + pointers + driver call)", r["run_us"]),
        ("dispatch (the Python path less guard and run)", r["dispatch_us"]),
        ("a refused call through the package (float32)", r["refused_call_us"]),
        ("eager of it", r["eager_refused_call_us"]),
    ]
    lines = [f"# The .cast hot path on the CPU (torch {r['torch']}; launch: {r['launch_stand_in']})", ""]
    lines += [f"Launcher: {r.get('launcher', '?')}.", ""]
    lines += ["| part | us per call |", "| --- | --- |"]
    lines += [f"| {name} | {value:.2f} |" for name, value in rows]
    lines += ["", "```", r["counters"], "```", ""]
    return "\n".join(lines)


# -- report ------------------------------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# .cast on {report['machine'].get('gpu_name', '?')}: {report['workload']}", ""]
    lines += [f"- package: `{report['package']}` ({report['kernels']} kernel(s)); command: `{report['command']}`"]
    lines += [f"- machine: {report['machine_text']}", ""]
    lines += ["## Audit", "", "| variant | decision | why |", "| --- | --- | --- |"]
    for a in report["audit"]:
        lines.append(f"| {a['variant']} | {a['decision']} | {a['reason'].replace('|', '/')} |")
    lines += ["", "## Kernels (from the package's verification)", ""]
    lines += ["| kernel | call | kernel us | eager us | vs eager (95%) | vs card baseline |"]
    lines += ["| --- | --- | --- | --- | --- | --- |"]
    for k in report["package_kernels"]:
        lat = k["latency"]
        interval = lat.get("interval_vs_eager") or ["?", "?"]
        lines.append(
            f"| {k['id']} | {k['call']} | {lat.get('kernel_us')} | {lat.get('eager_us')} | "
            f"{lat.get('speedup_vs_eager')} ({interval[0]}-{interval[1]}) | {lat.get('speedup_vs_baseline')} |"
        )
    c = report.get("correctness")
    if c:
        lines += ["", "## Outputs against eager", ""]
        lines += [
            f"{c['calls']} calls ({c['criterion']}): {c['outputs_outside_tolerance']} outside tolerance; "
            f"largest |diff| {c['max_abs_diff']:.3g} ({c['max_diff_over_max_eager']:.3g} of the largest eager value). "
            f"{c['first_problem']}",
            "",
            f"Kernel calls in them: {c['hits']} hits, {c['fallbacks']} fallbacks. Op level (shadow mode on every hit, "
            f"the same inputs again): {c['shadow_checks']} kernel calls compared with the original operator at the "
            f"card's tolerance; disabled: {c['disabled'] or 'none'}",
        ]
    e = report.get("end_to_end")
    if e:
        lines += ["", "## End to end (same process, interleaved rounds, no L2 flush)", ""]
        lines += [
            "| mode | device median us | wall median us (p10-p90) | host enqueue median us | back to back us per "
            "forward | speedup (device / wall / back to back) |"
        ]
        lines += ["| --- | --- | --- | --- | --- | --- |"]
        for mode in ("eager", "cast", "compile"):
            m = e[mode]
            speed = (
                "1"
                if mode == "eager"
                else " / ".join(f"{e[f'{mode}_speedup_{kind}']:.3f}" for kind in ("device", "wall", "back_to_back"))
            )
            lines.append(
                f"| {mode} | {m['device']['median_us']:.1f} | {m['wall']['median_us']:.1f} "
                f"({m['wall']['p10_us']:.1f}-{m['wall']['p90_us']:.1f}) | {m['host']['median_us']:.1f} "
                f"| {m['back_to_back']['median_us']:.1f} | {speed} |"
            )
    k = report.get("kernels_in_model")
    if k and "error" in k:
        lines += ["", f"## GPU kernels per forward: the profiler failed: {k['error']}"]
    elif k:
        lines += ["", f"## GPU kernels per forward (torch.profiler over {k['forwards']} forwards, us per forward)", ""]
        eager, ours = k["eager"]["kernels_us"], k["cast"]["kernels_us"]
        names = sorted(set(eager) | set(ours), key=lambda n: -max(eager.get(n, 0.0), ours.get(n, 0.0)))
        lines += ["| kernel | eager | cast |", "| --- | --- | --- |"]
        for name in names[:16]:
            short = name if len(name) <= 90 else name[:87] + "..."
            lines.append(f"| `{short.replace('|', '/')}` | {eager.get(name, 0.0):.1f} | {ours.get(name, 0.0):.1f} |")
        lines.append(f"| all kernels (GPU busy) | {k['eager']['busy_us']:.1f} | {k['cast']['busy_us']:.1f} |")
        if e:
            idle = [e[m]["device"]["median_us"] - k[m]["busy_us"] for m in ("eager", "cast")]
            lines += [
                "",
                f"End-to-end device median less the GPU's busy time (waiting for the host, or between launches): "
                f"eager {idle[0]:.1f} us, cast {idle[1]:.1f} us per forward.",
            ]
    h = report.get("host_by_op")
    if h and "error" in h:
        lines += ["", f"## Host time by operator: the profiler failed: {h['error']}"]
    elif h:
        eager, ours = h["eager"], h["cast"]
        moved = sorted(set(eager) | set(ours), key=lambda n: -abs(ours.get(n, 0.0) - eager.get(n, 0.0)))
        lines += ["", "## Host time by operator (torch.profiler CPU self time, us per forward; largest changes)", ""]
        lines += ["| operator | eager | cast |", "| --- | --- | --- |"]
        for name in moved[:14]:
            lines.append(f"| `{name[:80]}` | {eager.get(name, 0.0):.1f} | {ours.get(name, 0.0):.1f} |")
        lines.append(f"| all | {sum(eager.values()):.1f} | {sum(ours.values()):.1f} |")
    b = report.get("bystanders")
    if b:
        lines += ["", "## Operators the package does not override (host us per call, medians; package off / on)", ""]
        lines += [
            f"- small add: {b['add_eager_us']:.2f} / {b['add_cast_us']:.2f}; small softmax of another shape: "
            f"{b['softmax_eager_us']:.2f} / {b['softmax_cast_us']:.2f}"
        ]
    if report.get("host_overhead"):
        lines += ["", "## Host time per call (us; goal: guard + launch <= ~8 us, eager's own for a small op)", ""]
        lines += [
            "| kernel | eager | cast (dispatch + guard + launch) | the Python path (launcher off) "
            "| torch.library round trip | guard | launch (alloc + stream + driver) | alloc | stream | driver call "
            "| dispatch (Python path) | full guard | refused call | eager of it |"
        ]
        lines += ["| --- " * 14 + "|"]
        for kid, h in report["host_overhead"].items():
            lines.append(
                f"| {kid} | {h['eager_us']:.2f} | {h['cast_us']:.2f} | {h.get('python_path_us', math.nan):.2f} "
                f"| {h['round_trip_us']:.2f} "
                f"| {h['guard_us']:.2f} | {h['run_us']:.2f} | {h['alloc_us']:.2f} | {h['stream_us']:.2f} "
                f"| {h['driver_call_us']:.2f} | {h['dispatch_us']:.2f} | {h['guard_full_check_us']:.2f} "
                f"| {h['refused_call_us']:.2f} | {h['eager_refused_call_us']:.2f} |"
            )
        lines += [
            "",
            "The refused call is the same call in float32 (float64 for a float32 kernel), made on purpose by this "
            "timing, on a Cast of its own: its counters are below, not in the model's.",
        ]
        for h in report["host_overhead"].values():
            lines += [
                "",
                f"Launcher: {h.get('launcher', '?')}. Binding: {h.get('binding')}; launches retried inside "
                "torch's context (a context not current on "
                f"the thread; each costs several driver calls): {h.get('launch_retries')}",
                "",
                "```",
                h["counters"],
                "```",
            ]
    lines += ["", "## Hits and fallbacks (the model's: outputs against eager and end to end)", ""]
    lines += ["```", report["counters"], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", type=Path, help="a run of a softmax or rms_norm card (op mode)")
    what.add_argument("--capture", type=Path, help="a capture directory (model mode)")
    what.add_argument("--micro", action="store_true", help="the hot path on the CPU, no GPU (writes cast_micro.*)")
    parser.add_argument("--runs", type=Path, action="append", help="where the capture's runs are")
    parser.add_argument("--package", type=Path, help="use this package instead of exporting one")
    parser.add_argument("--out", type=Path, required=True, help="report directory")
    parser.add_argument("--calls", type=int, default=100, help="calls compared with eager")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--binding", choices=["cuda-bindings", "pycuda"], help="the CUDA driver binding")
    parser.add_argument("--host-only", action="store_true", help="only the host time per call (`host_overhead`)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.micro:
        text = micro_markdown(micro(args.out))
        (args.out / "cast_micro.md").write_text(text)
        print(text)
        return 0
    package = args.package or args.out / "model.cast"
    started = time.perf_counter()
    if args.package is None:
        target = args.run or args.capture
        say(f"exporting {target} with every check")
        export(target, package, runs=args.runs or (), progress=say)
    export_s = time.perf_counter() - started
    manifest: CastManifest = read_package(package).manifest
    machine = probe_machine()
    report: dict[str, Any] = {
        "command": " ".join(["python", "bench/cast_gpu.py", *(argv if argv is not None else sys.argv[1:])]),
        "package": str(package),
        "export_seconds": export_s,
        "machine": machine.model_dump(mode="json") if machine else {},
        "machine_text": machine.describe() if machine else "no CUDA device",
        "kernels": len(manifest.kernels),
        "audit": [json.loads(a.model_dump_json()) for a in manifest.audit],
        "package_kernels": [
            {"id": k.id, "call": k.guard.describe(), "latency": json.loads(k.latency.model_dump_json())}
            for k in manifest.kernels
        ],
        "workload": "",
    }
    cast = load(package, binding=args.binding)
    if args.capture is not None:
        report["workload"] = describe_capture(args.capture)
    if manifest.kernels and not args.host_only:
        work: Workload
        if args.capture is not None:
            work = ModelWorkload(args.capture)
            entry = None
        else:
            entry = manifest.kernels[0]
            work = OpWorkload(package, entry)
        report["workload"] = work.name
        say(f"comparing {args.calls} calls with eager")
        shadow = load(package, binding=args.binding, shadow_every=1) if entry is None else None
        report["correctness"] = correctness(work, cast, args.calls, entry, shadow)
        if shadow is not None:
            say(shadow.report())
        say("timing eager, the package and torch.compile")
        report["end_to_end"] = end_to_end(work, cast, args.rounds, args.per_round)
        say("operators the package does not override")
        report["bystanders"] = bystanders(cast)
    report["counters"] = cast.report()
    report["stats"] = json.loads(cast.stats().model_dump_json())
    if manifest.kernels and not args.host_only:
        say("GPU kernels per forward (torch.profiler)")
        try:
            report["kernels_in_model"] = kernel_profile(work, cast)
        except Exception as exc:  # a profiler that cannot start is a missing section, not a failed benchmark
            report["kernels_in_model"] = {"error": f"{type(exc).__name__}: {exc}"}
        say("host time by operator (torch.profiler)")
        try:
            report["host_by_op"] = host_profile(work, cast)
        except Exception as exc:  # as for the kernel profile
            report["host_by_op"] = {"error": f"{type(exc).__name__}: {exc}"}
    if manifest.kernels:
        say("host time per call")
        report["host_overhead"] = {k.id: host_overhead(package, args.binding, k) for k in manifest.kernels}
    (args.out / "cast_report.json").write_text(json.dumps(report, indent=1))
    (args.out / "cast_report.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
