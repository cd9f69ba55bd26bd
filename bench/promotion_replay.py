"""Replay a run's measurements in order: how often does promotion with statistics change the winner?

For each run, every measured node is taken in the order it was measured. "Naive" crowns whichever node has
the highest speedup so far (what the search did before promotion existed); "promoted" asks the engine's
`Champion` (a node must beat the best beyond the 95% interval of its speedup over the best's). Runs recorded
before timings kept their samples get the interval their stored summary (median, IQR-based cv, reps) gives.

    .venv/bin/python bench/promotion_replay.py [RUN_DIR ...] [--json OUT]   (default: examples/runs/*)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kernelforge_tui.engine.promotion import Champion, timed_pair  # noqa: E402
from kernelforge_tui.store import RunStore  # noqa: E402
from kernelforge_tui.vocabulary.nodes import MEASURED  # noqa: E402


def replay(run_dir: Path) -> dict[str, object]:
    with RunStore.open(run_dir, readonly=True) as store:
        records = [r for r in store.node_records() if r.status in MEASURED and r.last_measurement is not None]
        records.sort(key=lambda r: r.last_measurement or 0)
        champion = Champion()
        naive: tuple[int, float] | None = None
        naive_changes = promoted_changes = held = 0
        sampled = 0
        for rec in records:
            pair = timed_pair(store.evaluation(rec.id))
            sampled += pair is not None and bool(pair[0].samples_us)
            if rec.speedup is not None and (naive is None or rec.speedup > naive[1]):
                naive, naive_changes = (rec.id, rec.speedup), naive_changes + 1
            verdict = champion.consider(rec.id, rec.speedup, pair)
            if verdict is not None:
                promoted_changes += verdict.promoted
                held += not verdict.promoted
        return {
            "run": run_dir.name,
            "measured": len(records),
            "with_samples": sampled,
            "naive_best_changes": naive_changes,
            "promoted_best_changes": promoted_changes,
            "faster_but_within_noise": held,
            "naive_winner": naive[0] if naive else None,
            "naive_speedup": naive[1] if naive else None,
            "promoted_winner": champion.node_id,
            "promoted_speedup": champion.speedup,
            "winner_changed": (naive[0] if naive else None) != champion.node_id,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = args.runs or sorted(p for p in (ROOT / "examples" / "runs").iterdir() if (p / "run.sqlite").is_file())
    rows = [replay(run) for run in runs]
    table = Table(title="promotion with statistics, replayed")
    columns = ("run", "measured", "with_samples", "naive_best_changes", "promoted_best_changes")
    columns += ("faster_but_within_noise", "naive_winner", "promoted_winner", "winner_changed")
    for column in columns:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    Console().print(table)
    for row in rows:
        if row["winner_changed"]:
            Console().print(
                f"{row['run']}: naive winner node {row['naive_winner']} ({row['naive_speedup']:.4g}x), "
                f"promoted node {row['promoted_winner']} ({row['promoted_speedup']:.4g}x)"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
