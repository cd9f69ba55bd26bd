"""What the template benchmarks that build here and time on the H200 share (bench/gemm_cutlass.py,
bench/conv_cutlass.py): building a template's renders into cubins with the product's Builder and a manifest of how
to launch them, loading those cubins into torch's CUDA context with pycuda and launching them as the worker does, and
timing a launch with CUDA events after an L2 flush.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLUSH_BYTES = 256 << 20
REPS = 30
WARMUP = 5


@dataclass(frozen=True)
class Variant:
    case: str
    config: str
    cubin: str
    grid: list[int]
    block: int
    shared: int
    args: list[dict[str, Any]]
    """The resolved launch's arguments (cards.plan.ResolvedArg as JSON)."""


def build(
    out: Path, entry: str, cases: list[dict[str, Any]], card_of: Callable[[dict[str, Any]], Any],
    templates: Sequence[Any], variants: list[dict[str, Any]] | None = None, one_at_a_time: bool = False,
) -> None:  # fmt: skip
    """Render and build every case's seed configurations of each template that serves it, or `variants` (each a
    change to a template's first seed, where that template takes it) in their place, sandboxed as a search builds
    them; OUT/manifest.json lists the cases and how to launch each cubin, and each build's seconds. With several
    templates a configuration is named with its template's. `one_at_a_time`: one nvcc at a time, so that those
    seconds are one candidate's build, not a share of the machine (the median is what a search waits for a
    candidate of the template)."""
    from kernelforge_tui.build.nvcc import Builder
    from kernelforge_tui.cards.plan import resolve
    from kernelforge_tui.proposers.templates.common import describe

    builder = Builder(arch="sm_90", cache_dir=out / "cache", timeout_s=300)
    jobs = []
    for case in cases:
        card = card_of(case)
        serving = [t for t in templates if t.unsupported(card) is None]
        if not serving:
            sys.exit(f"{case['name']}: " + "; ".join(f"{t.name}: {t.unsupported(card)}" for t in templates))
        for template in serving:
            seeds = template.seed_params(card)
            named = f"{template.name}: " if len(templates) > 1 else ""
            for seed in [{**seeds[0], **change} for change in variants] if variants else seeds:
                params = template.valid(card, seed)
                if params is not None:
                    source, plan = template.render(card, params)
                    jobs.append((case, named + describe(params.as_dict()), source, resolve(plan, card)))

    async def run_all() -> list[Any]:
        builds = [builder.build(source, entry, launch.args) for _, _, source, launch in jobs]
        return [await b for b in builds] if one_at_a_time else await asyncio.gather(*builds)

    results = asyncio.run(run_all())
    built = []
    for (case, config, _, launch), result in zip(jobs, results, strict=True):
        if not result.ok:
            sys.exit(f"{case['name']} {config}: build failed\n{result.log[-3000:]}")
        name = f"{result.key[:16]}.cubin"
        (out / name).write_bytes(Path(result.cubin_path).read_bytes())
        args = [a.model_dump(mode="json") for a in launch.args]
        built.append(Variant(case["name"], config, name, list(launch.grid), launch.block[0], launch.shared_bytes, args))
    seconds = [r.seconds for r in results if not r.cached]
    manifest = {"cases": cases, "variants": [v.__dict__ for v in built], "build_seconds": seconds}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(built)} variants built ({len({v.cubin for v in built})} distinct sources)")
    if seconds:
        if one_at_a_time:
            what = "nvcc per build, one at a time"
        else:  # a build's seconds run from its request, so they hold the wait for a free slot
            what = f"request to result, up to {os.cpu_count()} builds at a time and the rest waiting"
        print(f"{what} ({len(seconds)} builds): median {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s")


class Cubins:
    """A manifest's cubins loaded into torch's CUDA context (its primary context, through pycuda), each function
    prepared with the parameter layout the worker uses (`tensor_maps.struct_format`)."""

    def __init__(self, cubins: Path, entry: str) -> None:
        import pycuda.driver as drv
        import torch

        from kernelforge_tui.tensor_maps import struct_format

        self.manifest = json.loads((cubins / "manifest.json").read_text())
        torch.manual_seed(0)
        torch.cuda.init()
        torch.empty(1, device="cuda")
        drv.init()
        self.context = drv.Device(0).retain_primary_context()
        self.context.push()
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.functions: dict[str, Any] = {}
        self.modules = []
        for v in self.manifest["variants"]:
            module = drv.module_from_buffer((cubins / v["cubin"]).read_bytes())
            self.modules.append(module)
            function = module.get_function(entry)
            function.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, v["shared"])
            codes = {"tensor": "P", "tensor_map": "map", "scalar": "i"}
            function.prepare(struct_format([codes[a["kind"]] for a in v["args"]]))
            self.functions[v["cubin"]] = function

    def variants(self, case: str) -> list[dict[str, Any]]:
        return [v for v in self.manifest["variants"] if v["case"] == case]

    def launcher(self, v: dict[str, Any], tensors: Mapping[str, Any]) -> Callable[[], None]:
        """A call that launches variant `v` on `tensors` (by the card's names; a tensor map encoded over its tensor)."""
        import numpy as np

        from kernelforge_tui.cards.plan import ResolvedArg
        from kernelforge_tui.tensor_maps import encode

        args: list[Any] = []
        for arg in map(ResolvedArg.model_validate, v["args"]):
            if arg.kind == "scalar":
                args.append(np.int32(arg.value))
                continue
            tensor = tensors[arg.name]
            if arg.tensor_map is None:
                args.append(np.uintp(tensor.data_ptr()))
            else:
                args.append(encode(arg.tensor_map, tensor.data_ptr(), tensor.numel() * tensor.element_size()))
        function = self.functions[v["cubin"]]

        def launch() -> None:
            function.prepared_call(tuple(v["grid"]), (v["block"], 1, 1), *args, shared_size=v["shared"])

        return launch

    def proven(
        self, case: str, tensors: Mapping[str, Any], error: Callable[[Any], dict[str, float]]
    ) -> tuple[list[dict[str, Any]], dict[str, Callable[[], None]]]:
        """Each of the case's variants launched once on `tensors` (the card's names; its output `y` filled with NaN
        first): a row of its error against the reference, and its launch by configuration, for `interleaved`."""
        import torch

        rows: list[dict[str, Any]] = []
        launchers: dict[str, Callable[[], None]] = {}
        for v in self.variants(case):
            launch = self.launcher(v, tensors)
            tensors["y"].fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            rows.append({"config": v["config"], "cubin": v["cubin"], **error(tensors["y"])})
            launchers[v["config"]] = launch
        return rows, launchers

    def timed(self, fn: Callable[[], Any]) -> float:
        """Microseconds of one call of `fn`, by CUDA events, after the L2 is flushed."""
        import torch

        self.flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end) * 1e3)

    def interleaved(self, calls: Mapping[str, Callable[[], Any]]) -> dict[str, list[float]]:
        """Each call timed REPS times, launch by launch in turn, after WARMUP untimed rounds."""
        for _ in range(WARMUP):
            for fn in calls.values():
                fn()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(REPS):
            for name, fn in calls.items():
                times[name].append(self.timed(fn))
        return times

    def close(self) -> None:
        self.context.pop()


def timed_rows(rows: list[dict[str, Any]], times: Mapping[str, list[float]], flops: int) -> dict[str, Any]:
    """Each variant's row with its time (`summary`), and the fastest row."""
    for row in rows:
        row.update(summary(times[row["config"]], flops))
    return min(rows, key=lambda r: r["median_us"])


def summary(samples: list[float], flops: int) -> dict[str, float]:
    """Median microseconds, coefficient of variation and TFLOP/s of a list of times."""
    median = statistics.median(samples)
    spread = statistics.pstdev(samples) / statistics.mean(samples)
    return {"median_us": median, "cv": spread, "tflops": flops / median / 1e6}


def error_against(ref: Any) -> Callable[[Any], dict[str, float]]:
    """How far an output lies from an fp32 reference: the largest error over the reference's RMS, and the share of
    elements outside rtol 1.6e-2 (bf16's assert_close default) with atol 1e-2 x that RMS."""
    rms = float(ref.pow(2).mean().sqrt())

    def error(y: Any) -> dict[str, float]:
        diff = (y.float() - ref).abs()
        outside = diff > 1e-2 * rms + 1.6e-2 * ref.abs()
        return {"max_error_over_rms": float(diff.max()) / rms, "outside": float(outside.float().mean())}

    return error


def configurations(report: dict[str, Any]) -> list[str]:
    """The report's table of every configuration of every case (markdown lines)."""
    lines = ["", "Every configuration:", "", "| case | config | us | TFLOP/s | cv | max err / rms | outside |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for entry in report["cases"]:
        for r in entry["variants"]:
            lines.append(
                f"| {entry['case']['name']} | {r['config']} | {r['median_us']:.1f} | {r['tflops']:.0f} | "
                f"{r['cv']:.1%} | {r['max_error_over_rms']:.2g} | {r['outside']:.2%} |"
            )
    return lines


def main(doc: str, build: Callable[[Path, list[dict[str, Any]] | None, bool], None],
         run: Callable[..., None], out: Path, **flags: str) -> None:  # fmt: skip
    """The benchmarks' command line: `build CUBINS [--variants V] [--one-at-a-time]` here, `run CUBINS --out OUT`
    on the GPU, and `split CUBINS --out DIR` (anywhere): one folder per configuration, to run each in a process
    of its own (a kernel that faults kills its process's CUDA context, and the rest of that run with it). `flags`:
    a bench's own switches for `run` (name: help), each passed to it as a keyword."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("step", choices=("build", "run", "split"))
    parser.add_argument("cubins", type=Path)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--variants", type=Path, help="build: a JSON list of changes to the first seed, in its place")
    parser.add_argument("--one-at-a-time", action="store_true", help="build: one nvcc at a time (to time each)")
    for name, text in flags.items():
        parser.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=text)
    args = parser.parse_args()
    if args.step == "build":
        args.cubins.mkdir(parents=True, exist_ok=True)
        build(args.cubins, json.loads(args.variants.read_text()) if args.variants else None, args.one_at_a_time)
    elif args.step == "split":
        for folder in split(args.cubins, args.out):
            print(folder)
    else:
        run(args.cubins, args.out, **{name: getattr(args, name) for name in flags})


def split(cubins: Path, out: Path) -> list[Path]:
    """OUT/<n>: a manifest of configuration n's variants (every case), its cubins linked from CUBINS; in the
    manifest's order, so that n names the same configuration on every machine."""
    manifest = json.loads((cubins / "manifest.json").read_text())
    configs = list(dict.fromkeys(v["config"] for v in manifest["variants"]))
    folders = []
    for number, config in enumerate(configs):
        folder = out / str(number)
        folder.mkdir(parents=True, exist_ok=True)
        variants = [v for v in manifest["variants"] if v["config"] == config]
        for v in variants:
            link = folder / v["cubin"]
            if not link.exists():
                link.symlink_to((cubins / v["cubin"]).resolve())
        cases = [c for c in manifest["cases"] if any(v["case"] == c["name"] for v in variants)]
        (folder / "manifest.json").write_text(json.dumps({**manifest, "cases": cases, "variants": variants}, indent=1))
        folders.append(folder)
    return folders
