"""Issue 16's check on one machine: a search and a small bench through a Dask cluster on localhost (a scheduler and
one worker per GPU, started with Dask's own commands, as the docs say), against the same search on the in-process
GPU lanes, side by side in one table.

    python bench/vs_cluster.py CARD --out DIR [--iters N | --minutes M] [--gpus N] [--worker-threads N]
                               [--bench-tasks TASK ...] [--bench-iters N] [--simulate [--simulate-seconds S]]

1. local: `kernelforge optimize CARD` on this machine's GPUs (one lane per GPU), its run in DIR/local.
2. The cluster: `dask scheduler --scheduler-file DIR/scheduler.json`, then per GPU `CUDA_VISIBLE_DEVICES=i dask worker
   --nthreads N --resources GPU=1` (with --simulate: --gpus workers offering fake GPUs, no device). N is this
   machine's cores per GPU (--worker-threads), as the docs advise: a GPU worker's threads run the cluster's builds
   besides its evaluations, as the local search builds on every core.
3. cluster: `kernelforge optimize CARD --cluster ADDRESS`, its run in DIR/cluster.
4. bench: `kernelforge bench --cluster ADDRESS --tasks ... --scales 10 --budget-iters N -o DIR/bench`.

Each search starts with an empty build cache of its own (DIR/<mode>-cache): neither finds the other's cubins.
Per search, from its run store: candidates, active seconds, candidates per minute, the GPUs' busy share (GPU seconds
of evaluation over active seconds times the GPUs it had), the best speedup, and which GPUs measured. The table goes
to stdout and DIR/vs_cluster.md, the numbers to DIR/vs_cluster.json. Every command runs as a user would run it
(subprocesses of this Python); the cluster is stopped at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel

from kernelforge_tui.engine.bench import load_manifest
from kernelforge_tui.gpu.detect import detect_gpus
from kernelforge_tui.store import RunStore

SCHEDULER_WAIT_S = 60.0


class SearchRow(BaseModel):
    """One search as its store records it."""

    mode: str
    gpus: int
    candidates: int
    active_s: float
    gpu_s: float
    best_speedup: float | None
    measured_on: dict[str, int]

    @property
    def per_minute(self) -> float:
        return self.candidates / max(self.active_s, 1e-9) * 60

    @property
    def busy(self) -> float:
        return self.gpu_s / max(self.active_s * self.gpus, 1e-9)


class BenchRow(BaseModel):
    cards: int
    finished: int
    wall_s: float
    overlapping: bool
    """Some cards were searched at the same time (spread over the GPUs)."""
    measured_on: dict[str, int]


class Result(BaseModel):
    card: str
    simulated: bool
    searches: list[SearchRow]
    bench: BenchRow | None = None


def kernelforge(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """A `kernelforge ... --json` command's JSON; SystemExit with its output when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "kernelforge_tui.cli", *args, "--json"],
        capture_output=True,
        text=True,
        env=os.environ | (env or {}),
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"vs_cluster: `kernelforge {' '.join(args)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return dict(json.loads(done.stdout))


def fresh_cache(path: Path) -> dict[str, str]:
    """The environment for a command that builds into an empty cache at `path` (emptied now)."""
    shutil.rmtree(path, ignore_errors=True)
    return {"KERNELFORGE_CACHE_DIR": str(path)}


def search_row(mode: str, run_dir: Path, gpus: int) -> SearchRow:
    with RunStore.open(run_dir, readonly=True) as store:
        info = store.run_info()
        return SearchRow(
            mode=mode,
            gpus=gpus,
            candidates=max(0, info.node_count - 1),
            active_s=info.active_seconds,
            gpu_s=info.gpu_seconds,
            best_speedup=info.best_speedup,
            measured_on=store.measured_on(),
        )


@contextlib.contextmanager
def local_cluster(out: Path, gpus: list[int | None], threads: int) -> Iterator[str]:
    """A scheduler and one worker per GPU (None: a fake GPU, for --simulate), as the docs do; its address."""
    scheduler_file = out / "scheduler.json"
    scheduler_file.unlink(missing_ok=True)
    logs = out / "cluster-logs"
    logs.mkdir(parents=True, exist_ok=True)
    dask = [sys.executable, "-m"]
    processes = [
        subprocess.Popen(
            [*dask, "distributed.cli.dask_scheduler", "--scheduler-file", str(scheduler_file), "--port", "0",
             "--dashboard-address", ":0"],
            stdout=subprocess.DEVNULL, stderr=(logs / "scheduler.log").open("w"),
        )
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + SCHEDULER_WAIT_S
        while not scheduler_file.exists():
            if time.monotonic() > deadline or processes[0].poll() is not None:
                raise SystemExit(f"vs_cluster: the Dask scheduler did not start (see {logs / 'scheduler.log'})")
            time.sleep(0.1)
        address = str(json.loads(scheduler_file.read_text())["address"])
        for n, gpu in enumerate(gpus):
            env = os.environ | ({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {})
            processes.append(
                subprocess.Popen(
                    [*dask, "distributed.cli.dask_worker", address, "--nthreads", str(threads), "--resources", "GPU=1",
                     "--dashboard-address", ":0", "--name", f"gpu-{gpu if gpu is not None else n}"],
                    stdout=subprocess.DEVNULL, stderr=(logs / f"worker-{n}.log").open("w"), env=env,
                )
            )  # fmt: skip
        yield address
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def run(args: argparse.Namespace) -> Result:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    budget = ["--budget-iters", str(args.iters)] if args.iters is not None else ["--budget-minutes", str(args.minutes)]
    simulate = ["--simulate", "--simulate-seconds", str(args.simulate_seconds)] if args.simulate else []
    found = [gpu.index for gpu in detect_gpus()]
    gpus: list[int | None] = [None] * args.gpus if args.simulate else list(found[: args.gpus or len(found)])
    if not gpus:
        raise SystemExit("vs_cluster: no GPU here: run it on the GPU machine, or with --simulate")
    rows = []
    local_dir = out / "local"
    kernelforge("optimize", str(args.card), "--run-dir", str(local_dir), *budget, *simulate,
                env=fresh_cache(out / "local-cache"))  # fmt: skip
    rows.append(search_row("local (in-process lanes)", local_dir, 1 if args.simulate else len(gpus)))
    bench = None
    env = {"KERNELFORGE_CLUSTER__WAIT_S": str(SCHEDULER_WAIT_S)} | fresh_cache(out / "cluster-cache")
    threads = args.worker_threads or max(2, (os.cpu_count() or 2) // len(gpus))
    with local_cluster(out, gpus, threads) as address:
        cluster_dir = out / "cluster"
        kernelforge("optimize", str(args.card), "--run-dir", str(cluster_dir), "--cluster", address, *budget, *simulate,
                    env=env)  # fmt: skip
        rows.append(search_row(f"cluster ({len(gpus)} workers)", cluster_dir, len(gpus)))
        if args.bench_tasks:
            began = time.monotonic()
            bench_dir = out / "bench"
            iters = str(args.bench_iters)
            kernelforge("bench", "--tasks", *args.bench_tasks, "--scales", "10", "--budget-iters", iters,
                        "--cluster", address, "-o", str(bench_dir), *simulate, env=env)  # fmt: skip
            bench = bench_row(bench_dir, time.monotonic() - began)
    return Result(card=str(args.card), simulated=args.simulate, searches=rows, bench=bench)


def bench_row(bench_dir: Path, wall_s: float) -> BenchRow:
    manifest = load_manifest(bench_dir)
    spans = sorted((c.started_at or 0.0, c.ended_at or 0.0) for c in manifest.cards if c.run_dir is not None)
    overlapping = any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))
    counts: collections.Counter[str] = collections.Counter()
    for card in manifest.cards:
        if card.run_dir is not None:
            with RunStore.open(card.run_dir, readonly=True) as store:
                counts.update(store.measured_on())
    finished = sum(c.state == "finished" for c in manifest.cards)
    return BenchRow(
        cards=len(manifest.cards), finished=finished, wall_s=wall_s, overlapping=overlapping, measured_on=dict(counts)
    )


def table(result: Result) -> str:
    tag = " (SIMULATED: invented timings)" if result.simulated else ""
    lines = [
        f"# A search on a Dask cluster against the in-process lanes{tag}",
        "",
        f"Card: `{result.card}`.",
        "",
        "| mode | GPUs | candidates | active s | candidates/min | GPU busy | best | measured on |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result.searches:
        best = f"{row.best_speedup:.3g}x" if row.best_speedup is not None else "-"
        where = "; ".join(f"{label}: {count}" for label, count in sorted(row.measured_on.items()))
        lines.append(
            f"| {row.mode} | {row.gpus} | {row.candidates} | {row.active_s:.1f} | {row.per_minute:.1f} | "
            f"{row.busy:.0%} | {best} | {where} |"
        )
    if result.bench is not None:
        b = result.bench
        where = "; ".join(f"{label}: {count}" for label, count in sorted(b.measured_on.items()))
        lines += [
            "",
            f"Bench through the cluster: {b.finished} of {b.cards} cards finished in {b.wall_s:.1f} s wall, "
            f"{'cards searched at the same time' if b.overlapping else 'one card at a time'}; measured on: {where}.",
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("card", type=Path, help="the card directory both searches run")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--iters", type=int, metavar="N", help="candidates per search")
    budget.add_argument("--minutes", type=float, default=2.0, metavar="M", help="minutes per search (2)")
    parser.add_argument("--gpus", type=int, metavar="N", help="GPUs (workers) to use (all here; 2 with --simulate)")
    parser.add_argument("--worker-threads", type=int, metavar="N", help="threads per Dask worker (cores per GPU)")
    parser.add_argument("--bench-tasks", nargs="*", default=["vector_add"], metavar="TASK")
    parser.add_argument("--bench-iters", type=int, default=8, metavar="N", help="candidates per bench card (8)")
    parser.add_argument("--simulate", action="store_true", help="no GPU: fake GPU workers, invented timings")
    parser.add_argument("--simulate-seconds", type=float, default=0.2, metavar="S")
    args = parser.parse_args(argv)
    if args.simulate and args.gpus is None:
        args.gpus = 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    text = table(result)
    (args.out / "vs_cluster.md").write_text(text)
    (args.out / "vs_cluster.json").write_text(result.model_dump_json(indent=1) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
