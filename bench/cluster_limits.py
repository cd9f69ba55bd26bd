"""How many GPUs one search coordinator can keep busy on a Dask cluster: the two limits, measured.

1. Evaluations per second through the scheduler: a search's whole path for one evaluation on the cluster (the
   coordinator's cache lookup, the GPU slot, the task to a worker and its answer), with the simulated backend on the
   workers answering at once (`--simulate-seconds 0`), so what is left is the cluster's and the coordinator's cost.
2. Verdicts per second into the run store: a candidate added and its verdict recorded (two SQLite transactions, as
   the search commits them: the one writer on the coordinator).

A GPU evaluation takes about a second (checks on every input set, then timing to a target error), so a coordinator
keeps about min(1, 2) GPUs busy; docs/guides/cluster.md's "Limits" reads these numbers.

    python bench/cluster_limits.py [--workers 2] [--seconds 10] [--address tcp://scheduler:8786]

Without --address it starts a LocalCluster of --workers processes offering fake GPUs. Writes cluster_limits.json
under $OUT when it is set.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import distributed
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelforge_tui.config import load_settings  # noqa: E402
from kernelforge_tui.engine.cluster.backend import Cluster, ClusterBackend  # noqa: E402
from kernelforge_tui.engine.cluster.remote import Simulation  # noqa: E402
from kernelforge_tui.engine.settings import RunSettings  # noqa: E402
from kernelforge_tui.store import RunStore  # noqa: E402
from kernelforge_tui.suite import cards as suite_cards  # noqa: E402
from kernelforge_tui.suite.registry import task  # noqa: E402
from kernelforge_tui.vocabulary.evaluation import Evaluation  # noqa: E402
from kernelforge_tui.vocabulary.nodes import NodeOutcome, NodeStatus  # noqa: E402


class Limits(BaseModel):
    workers: int
    evaluations_per_s: float
    """Through the scheduler, with as many evaluations in flight as GPU workers."""
    overhead_ms: float
    """Per evaluation, as a GPU lane sees it (workers / rate)."""
    store_verdicts_per_s: float


async def through_the_cluster(address: str, workers: int, seconds: float, root: Path) -> tuple[float, float]:
    settings = load_settings()
    card = suite_cards.write(task("vector_add"), "float32", 2**10, root / "cards")
    backend = ClusterBackend(card, settings, Cluster(address, settings), simulation=Simulation(eval_seconds=0.0))
    await backend.start()
    assert card.spec.baseline is not None
    source, plan = card.baseline_source(), card.spec.baseline.plan
    done = 0
    stop = time.monotonic() + seconds

    async def lane() -> None:
        nonlocal done
        while time.monotonic() < stop:
            evaluation = await backend.evaluate(source, plan)
            assert evaluation.ok, evaluation.reason
            done += 1

    try:
        await backend.evaluate(source, plan)  # the card reaches every worker before the clock starts
        began = time.monotonic()
        await asyncio.gather(*(lane() for _ in range(workers)))
        rate = done / (time.monotonic() - began)
    finally:
        await backend.close()
    return rate, workers / rate * 1000


def into_the_store(seconds: float, root: Path) -> float:
    card = suite_cards.write(task("vector_add"), "float32", 2**10, root / "store-card")
    assert card.spec.baseline is not None
    plan = card.spec.baseline.plan
    store = RunStore.create(root / "run", card, "simulated", "simulated", RunSettings())
    verdict = Evaluation(ok=False, failure="mismatch", reason="a verdict as big as a short one")
    outcome = NodeOutcome(status=NodeStatus.FAILED, failure="mismatch", reason=verdict.reason)
    done = 0
    began = time.monotonic()
    try:
        while time.monotonic() - began < seconds:
            node = store.add_node(None, f"// candidate {done}\n", plan, "mutation", "bench", {"n": done})
            store.finish_node(node.id, verdict, outcome, {})
            done += 1
    finally:
        store.close()
    return done / (time.monotonic() - began)


async def main_async(args: argparse.Namespace) -> Limits:
    with tempfile.TemporaryDirectory(prefix="kernelforge-limits-") as tmp:
        root = Path(tmp)
        if args.address:
            rate, overhead = await through_the_cluster(args.address, args.workers, args.seconds, root)
        else:
            async with distributed.LocalCluster(
                n_workers=args.workers,
                threads_per_worker=2,
                resources={"GPU": 1},
                dashboard_address=":0",
                asynchronous=True,
            ) as cluster:
                rate, overhead = await through_the_cluster(cluster.scheduler_address, args.workers, args.seconds, root)
        store_rate = into_the_store(args.seconds, root)
    return Limits(workers=args.workers, evaluations_per_s=rate, overhead_ms=overhead, store_verdicts_per_s=store_rate)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="GPU workers (fake ones without --address)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each measurement runs")
    parser.add_argument("--address", help="an existing scheduler whose workers offer GPU=1")
    limits = asyncio.run(main_async(parser.parse_args()))
    print(limits.model_dump_json(indent=1))
    out = os.environ.get("OUT")
    if out:
        Path(out, "cluster_limits.json").write_text(limits.model_dump_json(indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
