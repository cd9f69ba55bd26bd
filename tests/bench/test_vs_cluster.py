"""bench/vs_cluster.py without a GPU: a scheduler and two workers started with Dask's own commands (fake GPUs), the
same search on the in-process lanes and through the cluster, a small bench through it, and the table."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import task
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def load_vs_cluster() -> ModuleType:
    return load_script(ROOT / "bench" / "vs_cluster.py")


def test_the_search_through_the_cluster_against_the_in_process_lanes(tmp_path: Path) -> None:
    vs_cluster = load_vs_cluster()
    card = suite_cards.write(task("vector_add"), "float32", 2**10, tmp_path / "cards")
    out = tmp_path / "out"
    assert vs_cluster.main([str(card.root), "--out", str(out), "--iters", "4", "--simulate", "--simulate-seconds",
                            "0.1", "--bench-tasks", "vector_add", "--bench-iters", "2"]) == 0  # fmt: skip
    result = json.loads((out / "vs_cluster.json").read_text())
    local, cluster = result["searches"]
    assert local["candidates"] == cluster["candidates"] == 4 and local["gpus"] == 1 and cluster["gpus"] == 2
    assert local["measured_on"] == {}  # the in-process simulation names no GPU
    # Every evaluation (the baseline's too) on a worker; which ones depends on how fast the empty cache's builds come
    # (one at a time, they all go to the worker used last, where the card is loaded): the bench below uses both.
    assert sum(cluster["measured_on"].values()) == 5
    assert cluster["measured_on"] and all("(worker tcp://" in label for label in cluster["measured_on"])
    for mode in ("local", "cluster"):  # each search built into its own empty cache (no hits on the other's cubins)
        assert list((out / f"{mode}-cache" / "cubin").glob("*.cubin")), mode
    bench = result["bench"]
    assert bench["cards"] == bench["finished"] == 2 and bench["overlapping"] and len(bench["measured_on"]) == 2
    table = (out / "vs_cluster.md").read_text()
    assert "SIMULATED" in table and "| cluster (2 workers) | 2 | 4 |" in table
    assert "2 of 2 cards finished" in table and "cards searched at the same time" in table
    assert not list(out.glob("scheduler.json")) or json.loads((out / "scheduler.json").read_text())["address"]
