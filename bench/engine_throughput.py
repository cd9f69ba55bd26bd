"""Engine throughput: candidates fully evaluated per minute, and the share of wall time the GPU is busy.

Runs the real search (template proposer, GPU backend, a fresh run store) on a ~100 us card for a few
minutes. Goals on one H200: at least 60 candidates per minute, and the GPU busy more than half the time
(sum of the workers' GPU seconds over the search's wall time, start-up excluded and reported apart).

    python bench/engine_throughput.py --minutes 3            # on the GPU machine
    python bench/engine_throughput.py --minutes 0.2 --simulate   # smoke test without a GPU (invented timings)

Prints a short table; writes `engine_throughput.json` under $OUT when it is set.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelforge_tui.config import load_settings  # noqa: E402
from kernelforge_tui.engine.budget import Budget  # noqa: E402
from kernelforge_tui.engine.setup import RunOptions, prepare_run  # noqa: E402
from kernelforge_tui.vocabulary.events import BudgetUsed, EngineEvent  # noqa: E402

GOAL_PER_MINUTE = 60.0
GOAL_BUSY = 0.5


class BenchResult(BaseModel):
    """What one benchmark run measured (also the JSON written under $OUT)."""

    card: str
    backend: str
    gpu: str
    minutes: float
    candidates: int
    failures: int
    candidates_per_minute: float
    gpu_busy_share: float
    """Sum of the workers' GPU seconds over the search's wall time (start-up excluded)."""
    gpu_seconds: float
    profile_seconds: float
    """ncu's wall time on the profiles the search took (it holds a GPU lane meanwhile; 0 with --no-profile)."""
    search_wall_s: float
    startup_s: float
    """Building the harness and baseline, measuring ceilings, loading the card: before the search starts."""
    best_speedup: float | None
    best_ceiling_share: float | None
    stop_reason: str
    goal_per_minute: float = GOAL_PER_MINUTE
    goal_busy_share: float = GOAL_BUSY
    meets_goals: bool
    last_budget_event: dict[str, object] | None
    run_dir: str


async def bench(card_dir: Path, minutes: float, simulate: bool, run_dir: Path, profile: bool) -> BenchResult:
    settings = load_settings()
    if not profile:  # the evaluation pipeline alone: no automatic ncu profiles
        settings.profile = settings.profile.model_copy(update={"new_best": False, "beats_parent": False})
    options = RunOptions(  # one GPU: the goal is per GPU
        run_dir=run_dir, budget=Budget(max_minutes=minutes), simulate=simulate, simulate_seconds=0.3, max_gpus=1
    )
    search = prepare_run(card_dir, settings, options)
    card, store = search.card, search.store
    events = search.subscribe()
    t0 = time.monotonic()
    info = await search.run()
    total_wall = time.monotonic() - t0
    last: BudgetUsed | None = None
    while not events.empty():
        event: EngineEvent = events.get_nowait()
        if isinstance(event, BudgetUsed):
            last = event
    per_minute, busy = search.session_stats()
    search_wall = info.active_seconds
    profile_seconds = sum(
        saved.profile.seconds for node_id in store.profiled_ids() if (saved := store.profile(node_id)) is not None
    )
    store.close()
    return BenchResult(
        card=card.spec.name, backend=info.backend, gpu=info.gpu_name, minutes=minutes,
        candidates=search.meter.usage.iterations, failures=info.failure_count, candidates_per_minute=per_minute,
        gpu_busy_share=busy, gpu_seconds=info.gpu_seconds, profile_seconds=profile_seconds, search_wall_s=search_wall,
        startup_s=total_wall - search_wall, best_speedup=info.best_speedup,
        best_ceiling_share=info.best_ceiling_share, stop_reason=info.reason,
        meets_goals=per_minute >= GOAL_PER_MINUTE and busy > GOAL_BUSY,
        last_budget_event=last.model_dump(mode="json") if last else None, run_dir=str(run_dir),
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--card", default=str(ROOT / "examples" / "cards" / "vector_add_f32"))
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--simulate", action="store_true", help="no GPU: invented timings (smoke test only)")
    parser.add_argument("--run-dir", help="where the run store goes (default: a temporary directory)")
    parser.add_argument("--no-profile", action="store_true", help="no automatic ncu profiles: the pipeline alone")
    args = parser.parse_args()
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="kf-bench-")) / "run"
    result = asyncio.run(bench(Path(args.card), args.minutes, args.simulate, run_dir, not args.no_profile))

    table = Table(title=f"engine throughput: {result.card} on {result.gpu}")
    for column in ("measure", "value", "goal"):
        table.add_column(column)
    table.add_row("candidates evaluated", str(result.candidates), "")
    table.add_row("candidates / minute", f"{result.candidates_per_minute:.1f}", f">= {GOAL_PER_MINUTE:g}")
    table.add_row("GPU busy share", f"{result.gpu_busy_share:.0%}", f"> {GOAL_BUSY:.0%}")
    table.add_row("ncu profiling (GPU lane held)", f"{result.profile_seconds:.1f} s", "")
    table.add_row("search wall", f"{result.search_wall_s:.1f} s", "")
    table.add_row("start-up (not counted)", f"{result.startup_s:.1f} s", "")
    table.add_row("failures", str(result.failures), "")
    best = result.best_speedup
    table.add_row("best speedup", f"{best:.3g}x" if best is not None else "-", "")
    table.add_row("stopped", result.stop_reason, "")
    console = Console()
    console.print(table)
    if result.backend == "simulated":
        console.print("[yellow]SIMULATED: no GPU ran anything; these numbers only smoke-test the pipeline[/]")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "engine_throughput.json").write_text(result.model_dump_json(indent=2))
    return 0 if result.meets_goals or result.backend == "simulated" else 1


if __name__ == "__main__":
    raise SystemExit(main())
