"""Benchmark (not a test): evaluation overhead per candidate and timing stability, on a real GPU.

Overhead: wall time of `Evaluator.evaluate` for a ~100 us kernel whose cubin is already built (nvcc
excluded), i.e. loading, every correctness and anti-cheat check, and interleaved timing with the
baseline. Goal: under 0.5 s. Stability: coefficient of variation of the median over 10 evaluations of
the same kernel. Goal: under 1%.

    python bench/eval_overhead.py [--card examples/cards/vector_add_f32] [--kernel K.cu] [--evals 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from kernelforge_tui.cards import load_card, plan_for_kernel
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.backend import make_builder
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator

ROOT = Path(__file__).resolve().parent.parent


async def measure(card_dir: Path, kernel: Path, evals: int) -> dict[str, object]:
    settings = load_settings()
    gpu = require_gpu()[0]
    card = load_card(card_dir)
    plan = plan_for_kernel(kernel)
    source = kernel.read_text()
    evaluator = Evaluator(card, make_builder(settings, gpu.arch), settings, gpu)
    started = time.perf_counter()
    await evaluator.start()
    startup = time.perf_counter() - started
    first = await evaluator.evaluate(source, plan)  # builds (nvcc) and warms up: not counted
    assert first.ok, first.reason
    walls, medians, baselines, gpu_seconds = [], [], [], []
    for _ in range(evals):
        t0 = time.perf_counter()
        evaluation = await evaluator.evaluate(source, plan)
        walls.append(time.perf_counter() - t0)
        assert evaluation.ok and evaluation.result and evaluation.result.candidate and evaluation.result.baseline
        assert evaluation.build is not None and evaluation.build.cached
        medians.append(evaluation.result.candidate.median_us)
        baselines.append(evaluation.result.baseline.median_us)
        gpu_seconds.append(evaluation.result.gpu_seconds)
    await evaluator.close()
    cv = statistics.pstdev(medians) / statistics.mean(medians)
    assert evaluator.ceilings is not None
    return {
        "gpu": gpu.name,
        "card": card.spec.name,
        "kernel": str(kernel.relative_to(ROOT)) if kernel.is_relative_to(ROOT) else str(kernel),
        "startup_s": startup,
        "overhead_s_median": statistics.median(walls),
        "overhead_s_max": max(walls),
        "worker_s_median": statistics.median(gpu_seconds),
        "candidate_median_us": statistics.median(medians),
        "baseline_median_us": statistics.median(baselines),
        "cv_of_median": cv,
        "reps_last": evaluation.result.candidate.reps,
        "speedup": statistics.median(b / m for b, m in zip(baselines, medians, strict=True)),
        "ceiling_share": evaluation.ceiling_share,
        "copy_ceiling_gbps": evaluator.ceilings.copy_gbps,
        "fma_ceiling_tflops": evaluator.ceilings.fma_tflops,
        "medians_us": medians,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--card", type=Path, default=ROOT / "examples/cards/vector_add_f32")
    parser.add_argument("--kernel", type=Path)
    parser.add_argument("--evals", type=int, default=10)
    args = parser.parse_args()
    kernel = args.kernel or sorted((args.card / "candidates").glob("*.cu"))[0]
    report = asyncio.run(measure(args.card, kernel, args.evals))
    out = os.environ.get("OUT")
    if out:
        Path(out, "eval_overhead.json").write_text(json.dumps(report, indent=2))
    print(f"{'metric':<34}{'value':>14}  goal")
    print(f"{'overhead per candidate (median)':<34}{report['overhead_s_median']:>12.3f} s  < 0.5 s")
    print(f"{'overhead per candidate (max)':<34}{report['overhead_s_max']:>12.3f} s")
    print(f"{'CV of the median over evals':<34}{report['cv_of_median']:>13.3%}  < 1%")
    print(f"{'candidate median':<34}{report['candidate_median_us']:>11.2f} us")
    print(f"{'baseline median':<34}{report['baseline_median_us']:>11.2f} us")
    print(f"{'speedup':<34}{report['speedup']:>13.3f}x")
    print(f"{'share of copy ceiling':<34}{report['ceiling_share']:>13.1%}")
    print(f"{'copy ceiling':<34}{report['copy_ceiling_gbps']:>9.0f} GB/s")
    print(f"{'FMA ceiling':<34}{report['fma_ceiling_tflops']:>9.1f} TFLOP/s")


if __name__ == "__main__":
    main()
