"""Capture and optimise the example models on the GPU: the capture half of issue 11, end to end.

For each model (default: the Llama-style decoder block and the diffusion-style block, bf16, their "full" sizes on
CUDA): `kernelforge capture` (record, time with torch.profiler, rank, write the cards), print the ranked table, then
`kernelforge optimize CAPTURE_DIR` with the template proposer for a fixed budget split by expected saving, printing
the projected end-to-end saving as it goes. Writes everything under OUT_DIR (one capture directory per model, its
runs under it) and a JSON summary (OUT_DIR/capture_gpu.json, or --summary). A model that fails is recorded with its
error and the next one runs; the summary is rewritten after every step, so a run cut short keeps what it finished.

    python bench/capture_gpu.py OUT_DIR --minutes 2                 # on the GPU machine (torch, nvcc, pycuda)
    python bench/capture_gpu.py /tmp/cg --device cpu --simulate --iters 4   # smoke test without a GPU

On the device machine (no network; our dependencies come as wheels, see ../shared/device/README.md), e.g.
`python3 bench/capture_gpu.py /tmp/capture_gpu --minutes 2 --summary $OUT/capture_gpu.json`: the capture
directories hold stored sets of up to --max-set-mib each, so keep OUT_DIR off $OUT and send only the summary back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelforge_tui.capture.manifest import CaptureManifest  # noqa: E402
from kernelforge_tui.config import load_settings  # noqa: E402
from kernelforge_tui.engine.budget import Budget  # noqa: E402
from kernelforge_tui.engine.capture_search import CaptureOptimizeOptions, CaptureOptimizeReport, optimize_capture  # noqa: E402
from kernelforge_tui.errors import KernelForgeError  # noqa: E402

MODELS = {
    "decoder": ROOT / "examples" / "models" / "decoder_block.py",
    "diffusion": ROOT / "examples" / "models" / "diffusion_block.py",
    "resnet": ROOT / "examples" / "models" / "resnet_block.py",
}
console = Console(width=200, force_terminal=False)


def variant_rows(manifest: CaptureManifest, limit: int = 12) -> list[dict[str, Any]]:
    rows = []
    for v in manifest.variants[:limit]:
        rows.append(
            {
                "rank": v.rank,
                "id": v.id,
                "title": v.title,
                "status": v.status,
                "calls": v.calls,
                "us_per_call": round(v.time_per_call_us, 3),
                "share": round(v.share, 5),
                "expected_speedup": round(v.expected_speedup, 3),
                "expected_saving": round(v.expected_saving, 5),
                "card": v.card,
                "template": v.template,
                "why": v.reason if v.status != "card" else v.template_note,
                "card_note": v.reason if v.status == "card" else "",
                "estimate": v.estimate,
            }
        )
    return rows


def capture_summary(manifest: CaptureManifest, seconds: float) -> dict[str, Any]:
    carded = manifest.carded()
    return {
        "seconds": round(seconds, 1),
        "device": manifest.device,
        "device_name": manifest.device_name,
        "torch": manifest.torch_version,
        "timing": manifest.timing,
        "copy_gbps": manifest.copy_gbps,
        "calls": manifest.calls,
        "variants": len(manifest.variants),
        "cards": len(carded),
        "operator_time_us": round(manifest.total_time_us, 2),
        "forward_wall_us": round(manifest.forward_wall_us, 2),
        "carded_share": round(sum(v.share for v in carded), 5),
        "expected_saving_templates": round(sum(v.expected_saving for v in carded if v.template), 5),
        "top": variant_rows(manifest),
        "unsupported_top": [
            {"title": v.title, "share": round(v.share, 5), "why": v.reason}
            for v in sorted((v for v in manifest.variants if v.status == "unsupported"), key=lambda v: -v.share)[:6]
        ],
    }


def report_summary(report: CaptureOptimizeReport, seconds: float) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 1),
        "simulated": report.simulated,
        "comparable": report.comparable,
        "note": report.note,
        "projected_saving": round(report.projected_saving, 5),
        "saving_us": round(report.saving_us, 3),
        "operator_time_us": round(report.total_time_us, 3),
        "results": [
            {
                "variant": r.variant,
                "title": r.title,
                "card": r.card,
                "state": r.state,
                "reason": r.reason,
                "budget": r.budget.model_dump(exclude_none=True),
                "candidates": r.candidates,
                "gpu_seconds": round(r.gpu_seconds, 2),
                "best_node": r.best_node,
                "best_speedup_over_baseline": r.best_speedup,
                "best_latency_us": r.best_latency_us,
                "eager_us_per_call": round(r.eager_us_per_call, 3),
                "projected_us_per_call": r.projected_us_per_call,
                "calls": r.calls,
                "wall_seconds": round(r.wall_seconds, 1),
                "saving_us": round(r.saving_us, 3),
                "run_dir": str(r.run_dir) if r.run_dir else None,
            }
            for r in report.results
        ],
        "skipped": [s.model_dump() for s in report.skipped],
    }


class Progress:
    """A line whenever a variant's search starts, improves or ends, with the projected saving so far."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[str, float | None]] = {}

    def __call__(self, report: CaptureOptimizeReport) -> None:
        for r in report.results:
            key = (r.state, r.best_speedup)
            if r.state == "pending" or self.seen.get(r.variant) == key:
                continue
            self.seen[r.variant] = key
            best = f"{r.best_speedup:.3g}x over baseline, {r.best_latency_us or 0:.4g} us" if r.best_speedup else "-"
            console.print(
                f"{r.variant} {r.state}: best {best}; projected saving {report.projected_saving:.2%} "
                f"({report.saving_us:.4g} of {report.total_time_us:.4g} us)"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="directory for the capture directories and their runs")
    parser.add_argument("--models", nargs="*", default=["decoder", "diffusion"], choices=sorted(MODELS))
    parser.add_argument("--minutes", type=float, default=2.0, help="search budget per model, split by expected saving")
    parser.add_argument("--iters", type=int, help="candidate budget per model (instead of, or with, --minutes)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--size", help="the models' size (default: full on CUDA, small on the CPU)")
    parser.add_argument("--repeats", type=int, default=10, help="forward passes timed at capture")
    parser.add_argument("--max-set-mib", type=float, default=160, help="largest sampled call stored as a card set")
    parser.add_argument("--top", type=int, help="search only the N variants with the largest expected saving")
    parser.add_argument("--simulate", action="store_true", help="no GPU: real nvcc builds, invented timings")
    parser.add_argument("--summary", help="where the JSON summary goes (default: OUT/capture_gpu.json)")
    args = parser.parse_args()

    from kernelforge_tui.capture.run import CaptureRequest, capture_model
    from kernelforge_tui.cli.capture import render_capture, render_report, template_problem

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = Path(args.summary) if args.summary else out / "capture_gpu.json"
    summary: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "command": " ".join(sys.argv),
        "models": {},
    }

    def save() -> None:
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(json.dumps(summary, indent=1, default=str) + "\n")

    settings = load_settings()
    for name in args.models:
        entry: dict[str, Any] = {"file": str(MODELS[name].relative_to(ROOT))}
        summary["models"][name] = entry
        capture_dir = out / f"{name}.capture"
        console.rule(f"[bold]{name}: capture on {args.device}")
        begin = time.monotonic()
        try:
            kwargs = {"size": args.size} if args.size else {}
            request = CaptureRequest(
                MODELS[name],
                capture_dir,
                kwargs=kwargs,
                device=args.device,
                repeats=args.repeats,
                force=True,
                max_set_bytes=int(args.max_set_mib * 2**20),
            )
            manifest = capture_model(
                request, template_check=template_problem, progress=lambda line: console.print(line)
            )
        except (KernelForgeError, Exception) as exc:
            entry["capture_error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-4000:]
            console.print(f"[red]capture of {name} failed: {exc}[/]")
            save()
            continue
        entry["capture"] = capture_summary(manifest, time.monotonic() - begin)
        entry["capture_dir"] = str(capture_dir)
        save()
        render_capture(manifest, capture_dir, console)

        console.rule(
            f"[bold]{name}: optimize ({args.minutes:g} min{f', {args.iters} candidates' if args.iters else ''})"
        )
        options = CaptureOptimizeOptions(
            budget=Budget(max_minutes=args.minutes, max_iterations=args.iters),
            top=args.top,
            proposer="templates",
            simulate=args.simulate,
        )
        begin = time.monotonic()
        try:
            report = asyncio.run(optimize_capture(capture_dir, settings, options, Progress()))
        except (KernelForgeError, Exception) as exc:
            entry["optimize_error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-4000:]
            console.print(f"[red]optimize of {name} failed: {exc}[/]")
            save()
            continue
        entry["optimize"] = report_summary(report, time.monotonic() - begin)
        save()
        if report.results:
            console.print(render_report(report))
        for skipped in report.skipped:
            console.print(f"skipped {skipped.variant} {skipped.title}: {skipped.reason}")
        if report.comparable:
            console.print(f"[bold]{name}: projected end-to-end saving {report.projected_saving:.2%} ({report.note})[/]")
        else:
            console.print(f"[bold]{name}: projected saving: none ({report.note})[/]")
    summary["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    console.print(f"summary: {summary_path}")
    failed = [n for n, e in summary["models"].items() if "capture_error" in e or "optimize_error" in e]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
