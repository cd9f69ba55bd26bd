"""Benchmark (not a test): a .cast package end to end on the GPU.

Exports a package from a run (a softmax or rms_norm card's search) or from a capture directory and its runs, with
every check (`kernelforge export`), loads it, and in one process:
- runs the op (run mode: the exact captured call, fresh inputs each time) or the model's forward pass (capture mode:
  the model file rebuilt, its floating inputs redrawn each time) many times with the package loaded, comparing every
  output with eager PyTorch (the package's tolerance for an op; bf16/fp16/fp32 assert_close defaults and the largest
  difference for a model);
- times eager, the package and torch.compile of the same op or model, interleaved in rounds (CUDA events and
  synchronised wall clock per call; no L2 flush: end to end, as a model runs);
- measures the host time per call: eager's, the package's through the dispatcher (guard + launch), the guard alone,
  the launch alone, and a call the guard refuses (dispatch + guard + the original);
- counts hits and fallbacks;
and writes cast_report.json and cast_report.md to OUT.

    python bench/cast_gpu.py --run examples/runs/softmax_bf16 --out bench/results/cast_softmax
    python bench/cast_gpu.py --capture CAPTURE_DIR [--runs DIR] --out bench/results/cast_decoder
    python bench/cast_gpu.py --package model.cast --capture CAPTURE_DIR --out ...   (skip the export)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernelforge_tui.cast import load
from kernelforge_tui.cast.export import export
from kernelforge_tui.cast.manifest import CastManifest, KernelEntry, read_package
from kernelforge_tui.cast.probe import as_call, aten_call, card_of, input_sets
from kernelforge_tui.cast.runtime import Cast, disagreement, probe_machine

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
        args = []
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


def end_to_end(work: Workload, cast: Cast, rounds: int, per_round: int) -> dict[str, Any]:
    """Eager, the package and torch.compile, interleaved per round; CUDA events and synchronised wall clock."""
    work.redraw(0)
    say("compiling with torch.compile (the package not loaded)")
    compiled = work.compiled()
    modes: dict[str, Callable[[], Any]] = {"eager": work.forward, "cast": work.forward, "compile": compiled}
    for name, fn in modes.items():  # warm-up (and torch.compile's compilation)
        if name == "cast":
            with cast:
                for _ in range(5):
                    fn()
        else:
            for _ in range(5):
                fn()
    torch.cuda.synchronize()
    device: dict[str, list[float]] = {name: [] for name in modes}
    wall: dict[str, list[float]] = {name: [] for name in modes}
    new_event: Callable[..., Any] = torch.cuda.Event
    for r in range(rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        for name in order:
            if name == "cast":
                cast.activate()
            try:
                for _ in range(per_round):
                    torch.cuda.synchronize()
                    begin, end = new_event(enable_timing=True), new_event(enable_timing=True)
                    started = time.perf_counter()
                    begin.record()
                    modes[name]()
                    end.record()
                    torch.cuda.synchronize()
                    wall[name].append((time.perf_counter() - started) * 1e6)
                    device[name].append(begin.elapsed_time(end) * 1000.0)
            finally:
                cast.deactivate()
    result: dict[str, Any] = {}
    for name in modes:
        result[name] = {"device": summary(device[name]), "wall": summary(wall[name])}
    for name in ("cast", "compile"):
        for kind in ("device", "wall"):
            result[f"{name}_speedup_{kind}"] = result["eager"][kind]["median_us"] / result[name][kind]["median_us"]
    return result


def per_call_us(fn: Callable[[], Any], calls: int = 200, repeats: int = 15) -> float:
    """Host time per call: `calls` calls queued without a sync (fewer than the launch queue holds), best of
    `repeats` (the least disturbed by the rest of the machine)."""
    best = math.inf
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def host_overhead(package_path: Path, cast: Cast, entry: KernelEntry) -> dict[str, Any]:
    """Per call of one kernel's captured call: eager, through the package, the guard alone, the launch alone, and a
    call the guard refuses (another shape)."""
    work = OpWorkload(package_path, entry)
    op, args, kwargs = work.op, work.args, work.kwargs
    runner = next(r for r in cast.runners if r.entry.id == entry.id)
    admitted = runner.check(args, kwargs)
    assert not isinstance(admitted, str), admitted
    # A call the guard refuses: the same call in another dtype (eager takes it; no kernel covers it).
    other = {
        name: t.to(torch.float64 if t.dtype == torch.float32 else torch.float32) for name, t in work.tensors.items()
    }
    other_op, other_args, other_kwargs = aten_call(entry, other)
    result = {"eager_us": per_call_us(lambda: op(*args, **kwargs))}
    with cast:
        result["cast_us"] = per_call_us(lambda: op(*args, **kwargs))
        result["refused_call_us"] = per_call_us(lambda: other_op(*other_args, **other_kwargs))
    result["eager_refused_call_us"] = per_call_us(lambda: other_op(*other_args, **other_kwargs))
    result["guard_only_us"] = per_call_us(lambda: runner.check(args, kwargs), calls=2000)
    result["launch_only_us"] = per_call_us(lambda: runner.launch(admitted))
    result["goal_us"] = 8.0
    return result


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
        lines += ["| mode | device median us | wall median us (p10-p90) | speedup (device / wall) |"]
        lines += ["| --- | --- | --- | --- |"]
        for mode in ("eager", "cast", "compile"):
            m = e[mode]
            speed = "1" if mode == "eager" else f"{e[f'{mode}_speedup_device']:.3f} / {e[f'{mode}_speedup_wall']:.3f}"
            lines.append(
                f"| {mode} | {m['device']['median_us']:.1f} | {m['wall']['median_us']:.1f} "
                f"({m['wall']['p10_us']:.1f}-{m['wall']['p90_us']:.1f}) | {speed} |"
            )
    if report.get("host_overhead"):
        lines += ["", "## Host time per call (us; goal: guard + launch <= ~8 us, eager's own for a small op)", ""]
        lines += ["| kernel | eager | cast (dispatch + guard + launch) | guard | launch | refused call | eager of it |"]
        lines += ["| --- | --- | --- | --- | --- | --- | --- |"]
        for kid, h in report["host_overhead"].items():
            lines.append(
                f"| {kid} | {h['eager_us']:.2f} | {h['cast_us']:.2f} | {h['guard_only_us']:.2f} "
                f"| {h['launch_only_us']:.2f} | {h['refused_call_us']:.2f} | {h['eager_refused_call_us']:.2f} |"
            )
    lines += ["", "## Hits and fallbacks", "", "```", report["counters"], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", type=Path, help="a run of a softmax or rms_norm card (op mode)")
    what.add_argument("--capture", type=Path, help="a capture directory (model mode)")
    parser.add_argument("--runs", type=Path, action="append", help="where the capture's runs are")
    parser.add_argument("--package", type=Path, help="use this package instead of exporting one")
    parser.add_argument("--out", type=Path, required=True, help="report directory")
    parser.add_argument("--calls", type=int, default=100, help="calls compared with eager")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--binding", choices=["cuda-bindings", "pycuda"], help="the CUDA driver binding")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
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
    if manifest.kernels:
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
        say("host time per call")
        report["host_overhead"] = {k.id: host_overhead(package, cast, k) for k in manifest.kernels}
    report["counters"] = cast.report()
    report["stats"] = json.loads(cast.stats().model_dump_json())
    (args.out / "cast_report.json").write_text(json.dumps(report, indent=1))
    (args.out / "cast_report.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
