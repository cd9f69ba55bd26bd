"""Benchmark (not a test): a .cast package in eager, in a CUDA graph and inside torch.compile, against eager and
torch.compile, on the example blocks and on models the project did not write (bench/zoo_models.py: torchvision's
ResNet-50, a transformers Llama, timm's ViT), in one process per block.

Per block, unless --package gives one: `kernelforge capture` on CUDA, a short template search of its --top best
cards, fused chains among them (`optimize CAPTURE --top N`, automatic ncu profiles off), `kernelforge export` with
every check (agreement, sanitizer, faster than eager). Then, in this process, interleaved rounds
(`cast_gpu.time_modes`: per call CUDA events, synchronised wall clock and the host's enqueue time; forwards back
to back) of:
  eager; cast (eager + the package, `cast.load`); graph (`cast.graph`: the eager forward with the package, replayed
  as a CUDA graph, inputs copied in); compile (torch.compile, default) and compile-ro (reduce-overhead);
  kf and kf-ro (`cast.compile`, default and reduce-overhead); with --max-autotune also compile-ma and kf-ma;
each mode's outputs against eager (max and mean |diff|, and whether within the dtype's rtol of the output's scale),
where each mode's GPU time goes (torch.profiler: kernel time per forward against the back-to-back time, the
busiest kernels), and the package's counters (hits, graph nodes, compiled calls, used in). Then, per kernel, host
time per call: eager's, through the package (`cast_gpu.host_overhead`), and through its kernelforge op (what a
compiled graph pays per call). Writes OUT/<block>.json after each block, with what it measured before any error (a
block already there without an error is skipped: resumable), and OUT/compile_path.csv and .md from all of them.

    python bench/compile_path.py --out OUT [--blocks decoder llama ...] [--top 3] [--iters 24] [--max-autotune]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cast_gpu import ModelWorkload, Part, flat, host_overhead, say, time_modes

from kernelforge_tui.cast import compile as cast_compile
from kernelforge_tui.cast import graph as cast_graph
from kernelforge_tui.cast.export import export
from kernelforge_tui.cast.manifest import read_package
from kernelforge_tui.cast.ops import kernel_op
from kernelforge_tui.cast.runtime import Cast, aten_call, load, probe_machine

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
BLOCKS = {
    # name: (model file, capture entry); the first three are the example blocks, the rest models we did not write
    "decoder": (MODELS / "decoder_block.py", "build"),
    "diffusion": (MODELS / "diffusion_block.py", "build"),
    "resnet_block": (MODELS / "resnet_block.py", "build"),
    "resnet50": (ROOT / "bench" / "zoo_models.py", "resnet50"),
    "llama": (ROOT / "bench" / "zoo_models.py", "llama"),
    "vit": (ROOT / "bench" / "zoo_models.py", "vit"),
}
RTOL = {torch.bfloat16: 1.6e-2, torch.float16: 1e-3}


def package_for(block: str, work_dir: Path, iters: int, top: int) -> tuple[Path, Path, dict[str, float]]:
    """(capture directory, package, seconds per step): capture, search the `top` best cards (`iters` candidates
    each, chains among them), export."""
    from kernelforge_tui.cli.main import main

    model_file, entry = BLOCKS[block]
    capture = work_dir / f"{block}.capture"
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    argv = ["capture", str(model_file), "--entry", entry, "--device", "cuda", "--repeats", "2", "--samples", "1"]
    if main([*argv, "--max-set-mib", "1", "-o", str(capture), "--force"]) != 0:
        raise RuntimeError(f"capture of {model_file} ({entry}) failed")
    seconds["capture"] = time.perf_counter() - started
    started = time.perf_counter()
    os.environ["KERNELFORGE_PROFILE__NEW_BEST"] = os.environ["KERNELFORGE_PROFILE__BEATS_PARENT"] = "false"
    search = ["optimize", str(capture), "--top", str(top), "--budget-iters", str(iters * top)]
    code = main([*search, "--root", str(capture / "runs")])
    if code != 0:
        raise RuntimeError(f"the search of {capture}'s {top} best cards ended with {code}")
    seconds["search"] = time.perf_counter() - started
    started = time.perf_counter()
    package = work_dir / f"{block}.cast"
    manifest = export(capture, package, progress=say)
    seconds["export"] = time.perf_counter() - started
    if not manifest.kernels:
        raise RuntimeError(f"export kept no kernel: {[a.reason for a in manifest.audit if a.card][:3]}")
    return capture, package, seconds


def outputs_against_eager(eager: list[torch.Tensor], ours: list[torch.Tensor]) -> dict[str, Any]:
    """Max and mean |ours - eager| over the floating outputs, and whether every element is within the dtype's rtol
    of the output's scale (|diff| <= rtol * (|eager| + max |eager|), as cast_gpu's model check)."""
    worst, total, count, within = 0.0, 0.0, 0, True
    for o, e in zip(ours, eager, strict=True):
        if not e.is_floating_point():
            continue
        diff = (o.float() - e.float()).abs()
        scale = float(e.float().abs().max())
        worst = max(worst, float(diff.max()))
        total += float(diff.sum())
        count += diff.numel()
        rtol = RTOL.get(e.dtype, 1.3e-6)
        within = within and bool((diff <= rtol * (e.float().abs() + scale)).all())
    return {"max_abs_diff": worst, "mean_abs_diff": total / max(count, 1), "within_tolerance": within}


def modes_for(work: ModelWorkload, cast: Cast, max_autotune: bool) -> dict[str, Callable[[], Any]]:
    """Each mode's forward on the workload's current inputs (module docstring)."""
    model, kwargs = work.built.model, work.built.kwargs
    assert not kwargs, "the blocks take positional inputs"

    def under_no_grad(fn: Callable[..., Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                return fn(*work.args)

        return run

    graphed = cast_graph(model, work.args, cast)
    modes: dict[str, Callable[[], Any]] = {
        "eager": work.forward,
        "cast": work.forward,
        "graph": lambda: graphed(*work.args),
        "compile": under_no_grad(torch.compile(model)),
        "compile-ro": under_no_grad(torch.compile(model, mode="reduce-overhead")),
        "kf": under_no_grad(cast_compile(model, cast)),
        "kf-ro": under_no_grad(cast_compile(model, cast, mode="reduce-overhead")),
    }
    if max_autotune:
        modes["compile-ma"] = under_no_grad(torch.compile(model, mode="max-autotune"))
        modes["kf-ma"] = under_no_grad(cast_compile(model, cast, mode="max-autotune"))
    return modes


def plain_launcher(function: Any, grid: Any, block: Any, shared: int) -> Callable[[int, list[int]], None]:
    """The runtime's prepared launch of `function` through libcuda's cuLaunchKernel (11 arguments) instead of
    cuLaunchKernelEx: which of the two costs the host less."""
    import ctypes

    from kernelforge_tui.cast import driver as drivers

    raw = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    raw.restype = ctypes.c_int

    def on_error(error: int, stream: int, pointers: Any) -> None:
        raise RuntimeError(f"cuLaunchKernel failed: {error}")

    launch = drivers.RawLaunch(raw, extended=False)
    return drivers.ctypes_launcher(launch, int(function.handle), grid, block, shared, function.params, on_error)


def op_host_time(runner: Any, calls: int = 200, windows: int = 15) -> dict[str, float]:
    """Host us per call of the kernel's captured aten call eagerly, of its kernelforge op on the same inputs (what a
    compiled graph pays per call), and of the prepared driver call alone through cuLaunchKernelEx and through
    cuLaunchKernel (the best of `windows` windows of `calls` calls, taking turns; no sync inside one)."""
    guard = runner.entry.guard
    tensors = {g.name: torch.randn(g.shape, device="cuda").to(getattr(torch, g.dtype)) for g in guard.inputs}
    op, args, kwargs = aten_call(runner.entry, tensors)
    kernel = kernel_op(runner).overload
    ordered = [tensors[spec.name] for _, spec, _ in runner.tensor_args]
    device = torch.cuda.current_device()
    out = [t.data_ptr() for t in flat(kernel(*ordered))]  # the cubin loaded, the launch prepared
    pointers = [(out[i] if is_out else ordered[i].data_ptr()) for is_out, i in runner.order]
    stream = torch.cuda.current_stream().cuda_stream
    extended = runner.launchers[device]
    plan = runner.entry.launch
    plain = plain_launcher(runner.functions[device], plan.grid, plan.block, plan.shared_bytes)
    fns: dict[str, Callable[[], Any]] = {
        "eager_us": lambda: op(*args, **kwargs),
        "op_us": lambda: kernel(*ordered),
        "cuLaunchKernelEx_us": lambda: extended(stream, pointers),
        "cuLaunchKernel_us": lambda: plain(stream, pointers),
    }
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(windows):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - started) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def where_time_goes(fn: Callable[[], Any], forwards: int = 3, top: int = 8) -> dict[str, Any]:
    """GPU kernel time per forward (torch.profiler's device time of every kernel, CUDA graph replays included) and
    the kernels that take most of it: set against the forward's back-to-back time, the share the GPU is busy."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    kernels.sort(key=lambda e: -e.self_device_time_total)
    return {
        "kernel_us": sum(e.self_device_time_total for e in kernels) / forwards,
        "top": [
            {"name": e.key[:90], "us": e.self_device_time_total / forwards, "calls": e.count / forwards}
            for e in kernels[:top]
        ],
    }


def bench_block(block: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Fills `report` as it goes: a later step's failure keeps what the earlier ones measured."""
    started = time.perf_counter()
    if args.package:
        capture, package = args.capture, args.package
    else:
        capture, package, report["prepare_seconds"] = package_for(block, args.work, args.iters, args.top)
    manifest = read_package(package).manifest
    report["package"] = str(package)
    report["kernels"] = [
        {"id": k.id, "call": k.guard.describe(), "latency": json.loads(k.latency.model_dump_json())}
        for k in manifest.kernels
    ]
    cast = load(package)
    work = ModelWorkload(capture)
    report["workload"] = work.name
    say(f"{block}: compiling and capturing every mode")
    modes = modes_for(work, cast, args.max_autotune)
    eager = [t.clone() for t in flat(modes["eager"]())]
    report["outputs"] = {}
    for name, fn in modes.items():
        first = time.perf_counter()
        with cast if name == "cast" else contextlib.nullcontext():
            ours = [t.clone() for t in flat(fn())]
        torch.cuda.synchronize()
        report["outputs"][name] = {**outputs_against_eager(eager, ours), "first_call_s": time.perf_counter() - first}
    say(f"{block}: timing {', '.join(modes)}")
    parts: dict[str, Part] = {name: (fn, (lambda: cast) if name == "cast" else None) for name, fn in modes.items()}
    report["timing"] = time_modes(parts, args.rounds, args.per_round)
    report["profile"] = {}
    for name, fn in modes.items():
        with cast if name == "cast" else contextlib.nullcontext():
            report["profile"][name] = where_time_goes(fn)
    report["stats"] = json.loads(cast.stats().model_dump_json())
    report["used_in"] = {k.kernel: k.used_in for k in cast.stats().kernels}
    report["counters"] = cast.report()
    say(f"{block}: host time per call")
    # eager's host cost per call, for the kernels an eager call can reach (a chain's kernel: compiled graphs only)
    report["host_overhead"] = {k.id: host_overhead(package, None, k) for k in manifest.kernels if "eager" in k.serves}
    report["op_host"] = {r.entry.id: op_host_time(r) for r in cast.runners}
    report["seconds"] = time.perf_counter() - started


def table(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in reports:
        if "timing" not in r:
            continue
        eager = r["timing"]["eager"]
        for mode, t in r["timing"].items():
            out = r["outputs"][mode]
            rows.append(
                {
                    "block": r["block"],
                    "mode": mode,
                    "device_median_us": round(t["device"]["median_us"], 1),
                    "device_p10_us": round(t["device"]["p10_us"], 1),
                    "device_p90_us": round(t["device"]["p90_us"], 1),
                    "wall_median_us": round(t["wall"]["median_us"], 1),
                    "host_median_us": round(t["host"]["median_us"], 1),
                    "back_to_back_us": round(t["back_to_back"]["median_us"], 1),
                    "back_to_back_p10_us": round(t["back_to_back"]["p10_us"], 1),
                    "back_to_back_p90_us": round(t["back_to_back"]["p90_us"], 1),
                    "speedup_back_to_back": round(
                        eager["back_to_back"]["median_us"] / t["back_to_back"]["median_us"], 3
                    ),
                    "speedup_wall": round(eager["wall"]["median_us"] / t["wall"]["median_us"], 3),
                    "max_abs_diff": out["max_abs_diff"],
                    "mean_abs_diff": out["mean_abs_diff"],
                    "within_tolerance": out["within_tolerance"],
                    "first_call_s": round(out["first_call_s"], 1),
                    "gpu_kernel_us": round(r.get("profile", {}).get(mode, {}).get("kernel_us", float("nan")), 1),
                }
            )
    return rows


def markdown(reports: list[dict[str, Any]], rows: list[dict[str, Any]], machine: str, command: str) -> str:
    lines = [f"# The compile path on {machine}", "", f"Command: `{command}`", ""]
    for r in reports:
        lines += [f"## {r['block']}: {r.get('workload', '')}", ""]
        if "error" in r:
            lines += ["```", r["error"], "```", ""]
            if "timing" not in r:
                continue
        lines += [f"- package: `{r['package']}`; prepared in {r.get('prepare_seconds', {})} s"]
        for k in r["kernels"]:
            lat = k["latency"]
            lines.append(
                f"- kernel {k['id']}: {k['call']}: {lat.get('kernel_us')} us vs eager {lat.get('eager_us')} us "
                "at export"
            )
        lines += [
            "",
            "| mode | device us (p10-p90) | wall us | host enqueue us | back to back us (p10-p90) | x eager "
            "(back to back) | max abs diff | mean abs diff | within tolerance | first call s (compile) "
            "| GPU kernels us (busy) |",
            "| --- " * 11 + "|",
        ]
        for row in (x for x in rows if x["block"] == r["block"]):
            lines.append(
                f"| {row['mode']} | {row['device_median_us']} ({row['device_p10_us']}-{row['device_p90_us']}) "
                f"| {row['wall_median_us']} | {row['host_median_us']} | {row['back_to_back_us']} "
                f"({row['back_to_back_p10_us']}-{row['back_to_back_p90_us']}) | {row['speedup_back_to_back']} "
                f"| {row['max_abs_diff']:.3g} | {row['mean_abs_diff']:.3g} | {row['within_tolerance']} "
                f"| {row['first_call_s']} | {row['gpu_kernel_us']} "
                f"({row['gpu_kernel_us'] / row['back_to_back_us']:.0%}) |"
            )
        for mode in ("compile-ro", "kf-ro"):
            top = r.get("profile", {}).get(mode, {}).get("top", [])
            lines += ["", f"Where {mode}'s GPU time goes (us per forward, calls): "]
            lines += [f"- {k['us']:.1f} us, {k['calls']:g} x `{k['name']}`" for k in top]
        lines += ["", "Host time per call (us):", ""]
        nan = float("nan")
        for kid, op in r.get("op_host", {}).items():
            h = r.get("host_overhead", {}).get(kid)
            through = (
                "compile only: no eager call reaches it"
                if h is None
                else (
                    f"eager {h['eager_us']:.2f}; through the package {h['cast_us']:.2f} (launcher: "
                    f"{h.get('launcher', '?')}; the Python path {h.get('python_path_us', nan):.2f}: guard "
                    f"{h['guard_us']:.2f}, alloc {h['alloc_us']:.2f}, driver call {h['driver_call_us']:.2f}, dispatch "
                    f"{h['dispatch_us']:.2f}); a refused call {h['refused_call_us']:.2f} vs eager "
                    f"{h['eager_refused_call_us']:.2f}"
                )
            )
            lines.append(
                f"- {kid}: {through}; the kernelforge op {op.get('op_us', nan):.2f} vs eager "
                f"{op.get('eager_us', nan):.2f}; the driver call alone: cuLaunchKernelEx "
                f"{op.get('cuLaunchKernelEx_us', nan):.2f}, cuLaunchKernel {op.get('cuLaunchKernel_us', nan):.2f}"
            )
        lines += ["", "```", r.get("counters", ""), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/compile_path"), help="captures and packages")
    parser.add_argument("--blocks", nargs="+", choices=sorted(BLOCKS), default=list(BLOCKS))
    parser.add_argument("--iters", type=int, default=24, help="candidates each searched card's search evaluates")
    parser.add_argument("--top", type=int, default=3, help="cards searched per block, best expected saving first")
    parser.add_argument("--package", type=Path, help="use this package (with --capture; one block)")
    parser.add_argument("--capture", type=Path, help="the capture the package was exported from")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--max-autotune", action="store_true", help="also mode=max-autotune (minutes to compile)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 64  # one model, many backends and modes: each is a cache entry
    command = " ".join(["python", "bench/compile_path.py", *(argv if argv is not None else sys.argv[1:])])
    machine = probe_machine()
    reports = []
    for block in args.blocks:
        path = args.out / f"{block}.json"
        before = json.loads(path.read_text()) if path.exists() else None
        if before is not None and "error" not in before:
            say(f"{block}: done before ({path})")
            reports.append(before)
            continue
        report: dict[str, Any] = {"block": block}
        try:
            bench_block(block, args, report)
        except Exception as exc:  # one block's failure is written down beside what it measured; the next one runs
            report["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        say(f"{block}: {report.get('seconds', 0):.0f} s")
        path.write_text(json.dumps(report, indent=1, default=str))
        reports.append(report)
        torch._dynamo.reset()
    rows = table(reports)
    if rows:
        with (args.out / "compile_path.csv").open("w", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    text = markdown(reports, rows, machine.describe() if machine else "no GPU", command)
    (args.out / "compile_path.md").write_text(text)
    print(text)
    return 0 if all("error" not in r for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
