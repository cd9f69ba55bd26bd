"""Benchmark: the TUI on a synthetic run of 10,000 nodes growing at 50 nodes a second.

Measures the CPU time to fold one batch of events into the panes and redraw (the app folds events 4 times
a second, so a batch is ~13 new nodes plus ~25 changed ones), and memory over time: RSS, and with
`--heap` the Python heap (tracemalloc), while the run grows and while it only changes (where it must stay
flat). Times are taken without tracemalloc unless `--heap` is given: tracing every allocation makes the
app 3-4 times slower, so timings under `--heap` measure the tracer, not the app.

    .venv/bin/python bench/tui_updates.py [--nodes 10000] [--batches 200] [--heap]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelforge_tui.tui.app import KernelForgeApp  # noqa: E402
from kernelforge_tui.tui.config import TuiSettings  # noqa: E402
from kernelforge_tui.tui.widgets import SearchTree  # noqa: E402
from kernelforge_tui.tui.widgets.tree import FilterMode  # noqa: E402
from tests.support.fakes.synthetic import SyntheticSource  # noqa: E402

RATE, HZ = 50, 4
SCENARIOS: list[tuple[str, bool, FilterMode]] = [
    ("grow 50/s, lazy tree", True, "all"),
    ("changes only, lazy tree", False, "all"),
    ("grow 50/s, filter improving", True, "improving"),
    ("changes only, filter", False, "improving"),
]
APPLY: list[float] = []
GOAL_MS = 50.0


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def phase(app: KernelForgeApp, source: SyntheticSource, pilot: object, batches: int, grow: bool) -> list[float]:
    times = []
    per_batch = RATE // HZ + (1 if grow else 0)
    for _ in range(batches):
        source.grow(per_batch if grow else 0, changes=2 * per_batch)
        # CPU time, not wall time: Pilot.pause() sleeps until the app is idle, and those sleeps are not work.
        t0 = time.process_time()
        await app.pump()
        t1 = time.process_time()
        await pilot.pause()  # type: ignore[attr-defined]  # the refresh and the redraw it triggers
        times.append((time.process_time() - t0) * 1000)
        APPLY.append((t1 - t0) * 1000)
    return times


def heap_mib() -> float:
    """The traced Python heap, or 0 when tracemalloc is off."""
    return tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else 0.0


def row(name: str, times: list[float], mem: tuple[float, float, float, float]) -> str:
    p95 = statistics.quantiles(times, n=20)[-1]
    heap0, heap1, rss0, rss1 = mem
    median = statistics.median(times)
    return f"{name:<28} {median:>7.1f} {p95:>7.1f} {max(times):>7.1f}  {heap1 - heap0:>+8.2f} {rss1 - rss0:>+8.1f}"


async def main(nodes: int, batches: int, heap: bool) -> None:
    if heap:
        tracemalloc.start()
        print("tracemalloc is on: heap deltas are real, timings are inflated by the tracer")
    t0 = time.perf_counter()
    source = SyntheticSource(nodes)
    app = KernelForgeApp(source, TuiSettings(refresh_hz=HZ))
    print(f"synthetic run: {nodes} nodes generated in {time.perf_counter() - t0:.1f} s")
    async with app.run_test(size=(200, 60)) as pilot:
        t0 = time.perf_counter()
        await pilot.pause()
        print(f"open (snapshot, state, tree, first paint): {(time.perf_counter() - t0) * 1000:.0f} ms")
        app.action_jump_best()
        await pilot.pause()
        print(f"{'scenario':<28} {'median':>7} {'p95':>7} {'max':>7}  {'heap MiB':>8} {'RSS MiB':>8}   (ms per batch)")
        tree = app.query_one(SearchTree)
        for name, grow, mode in SCENARIOS:
            if tree.filter_mode != mode:
                tree.filter_mode = mode
                await pilot.pause()
            heap0, rss0 = heap_mib(), rss_mib()
            times = await phase(app, source, pilot, batches, grow)
            heap1, rss1 = heap_mib(), rss_mib()
            print(row(name, times, (heap0, heap1, rss0, rss1)) + f"   apply {statistics.median(APPLY):.1f}")
            APPLY.clear()
        lines = tree.last_line + 1
        print(f"nodes at the end: {len(app.state.nodes)}; tree lines drawn: {lines}; goal < {GOAL_MS:.0f} ms a batch")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--heap", action="store_true", help="trace the Python heap (slows the app 3-4x)")
    args = parser.parse_args()
    asyncio.run(main(args.nodes, args.batches, args.heap))
