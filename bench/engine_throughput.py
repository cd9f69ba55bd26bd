"""Benchmark (not a test): engine throughput with the template proposer on one GPU.

Runs `kernelforge optimize` on a ~100 us card (vector add, 2^25 floats) for a few minutes and reports
the candidates fully evaluated per minute (goal: at least 60) and the share of wall time the GPU worker
was busy (goal: above 50%), from the run's own accounting.

    python bench/engine_throughput.py [--card examples/cards/vector_add_f32] [--minutes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--card", type=Path, default=ROOT / "examples/cards/vector_add_f32")
    parser.add_argument("--minutes", type=float, default=2.0)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="kf-throughput-")) / "run"
    command = [sys.executable, "-m", "kernelforge_tui.cli", "optimize", str(args.card),
               "--budget-minutes", str(args.minutes), "--run-dir", str(run_dir), "--json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"optimize failed ({done.returncode}): {done.stderr[-2000:]}")
    info = json.loads(done.stdout)
    wall = info["ended_at"] - info["started_at"]
    evaluated = info["node_count"] - 1  # the root is the card's baseline
    report = {
        "card": info["card_name"],
        "gpu": info["gpu_name"],
        "wall_s": wall,
        "candidates": evaluated,
        "candidates_per_minute": evaluated / (wall / 60),
        "gpu_busy_share": info["gpu_seconds"] / wall,
        "best_speedup": info["best_speedup"],
        "best_ceiling_share": info["best_ceiling_share"],
        "stop_reason": info.get("reason", ""),
    }
    if out := os.environ.get("OUT"):
        Path(out, "engine_throughput.json").write_text(json.dumps(report, indent=2))
    print(f"{'candidates evaluated':<30}{evaluated:>10}")
    print(f"{'wall time':<30}{wall:>9.1f} s")
    print(f"{'candidates per minute':<30}{report['candidates_per_minute']:>10.1f}  goal >= 60")
    print(f"{'GPU busy share of wall time':<30}{report['gpu_busy_share']:>10.1%}  goal > 50%")
    print(f"{'best speedup':<30}{info['best_speedup']:>9.2f}x  ({info['best_ceiling_share']:.0%} of ceiling)")
    print(f"stopped: {report['stop_reason']}")


if __name__ == "__main__":
    main()
