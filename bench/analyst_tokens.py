"""Prompt tokens the analyst's filter saves: the full Nsight Compute report against the classified section.

For every profiled node of the recorded runs, two prompt sections about the same profile: "full" carries every
metric ncu reported (one line each: section, name, value), as a team without the hardware-analysis layer would
send it; "filtered" is what the agents send (`proposers.sections.profile_text`: the bottleneck class, why, the
metrics for that class, the top stalls, the roofline). Tokens are the prompts' own estimate
(`proposers.prompting.estimate_tokens`, 4 characters a token).

    .venv/bin/python bench/analyst_tokens.py [RUN_DIR ...] [--json OUT]   (default: examples/runs/*,
                                              bench/results/analyst_tokens.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kernelforge_tui.proposers.prompting import estimate_tokens  # noqa: E402
from kernelforge_tui.proposers.sections import profile_text  # noqa: E402
from kernelforge_tui.store import RunStore  # noqa: E402
from kernelforge_tui.vocabulary.profiles import NodeProfile, format_value  # noqa: E402


def full_report(profile: NodeProfile) -> str:
    """Every metric of the report as a line."""
    report = profile.profile
    lines = [f"{report.kernel}: every metric Nsight Compute reported"]
    lines += [f"  {m.section}: {m.name} = {format_value(m.value, m.unit)}" for m in report.metrics.values()]
    return "\n".join(lines)


@dataclass(frozen=True)
class Row:
    run: str
    node: int
    kernel: str
    bottleneck: str
    metrics: int
    full_tokens: int
    filtered_tokens: int

    @property
    def saved(self) -> float:
        return 1 - self.filtered_tokens / self.full_tokens


def measure(run_dir: Path) -> list[Row]:
    rows: list[Row] = []
    with RunStore.open(run_dir, readonly=True) as store:
        for node_id in sorted(store.profiled_ids()):
            profile = store.profile(node_id)
            if profile is None:
                continue
            rows.append(
                Row(
                    run_dir.name,
                    node_id,
                    profile.profile.kernel,
                    profile.hardware.bottleneck,
                    len(profile.profile.metrics),
                    estimate_tokens(full_report(profile)),
                    estimate_tokens(profile_text(profile)),
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "analyst_tokens.json")
    args = parser.parse_args()
    runs = args.runs or sorted(p for p in (ROOT / "examples" / "runs").iterdir() if (p / "run.sqlite").is_file())
    rows = [row for run in runs for row in measure(run)]
    if not rows:
        raise SystemExit("no profiled nodes in the runs given")
    table = Table(title="prompt tokens: full ncu report vs the analyst's filtered section")
    for column in ("run", "node", "kernel", "bottleneck", "metrics", "full tokens", "filtered tokens", "saved"):
        table.add_column(column, justify="left" if column in ("run", "kernel", "bottleneck") else "right")
    for row in rows:
        table.add_row(
            row.run,
            str(row.node),
            row.kernel,
            row.bottleneck,
            str(row.metrics),
            str(row.full_tokens),
            str(row.filtered_tokens),
            f"{row.saved:.1%}",
        )
    full = sum(row.full_tokens for row in rows)
    filtered = sum(row.filtered_tokens for row in rows)
    summary = {
        "profiles": len(rows),
        "full_tokens_total": full,
        "filtered_tokens_total": filtered,
        "saved_total": round(1 - filtered / full, 4),
        "full_tokens_median": statistics.median(row.full_tokens for row in rows),
        "filtered_tokens_median": statistics.median(row.filtered_tokens for row in rows),
        "estimate": "tokens = ceil(characters / 4)",
    }
    console = Console(width=130)
    console.print(table)
    console.print(
        f"{len(rows)} profiles: {full} tokens in full, {filtered} filtered ({summary['saved_total']:.1%} saved); "
        f"median per profile {summary['full_tokens_median']} vs {summary['filtered_tokens_median']}"
    )
    args.json.write_text(
        json.dumps(
            {"summary": summary, "profiles": [asdict(row) | {"saved": round(row.saved, 4)} for row in rows]}, indent=2
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
