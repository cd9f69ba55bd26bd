"""Which GPUs measured a run's candidates: `RunStore.measured_on` counts the evaluations per `measured_on` label, and
`kernelforge runs` shows how many GPUs (a GPUs column) and, with --json, the counts; on stores made here with
RunStore and Evaluations labelled as a cluster, a local GPU and an old run label them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kernelforge_tui.cards import load_card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cli.main import main
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.store import DB_NAME, RunStore
from kernelforge_tui.vocabulary.evaluation import EvalResult, Evaluation, Timing
from kernelforge_tui.vocabulary.nodes import NodeOutcome, NodeStatus
from tests.conftest import EXAMPLES

PLAN = LaunchPlan(entry="k", grid=[1], block=[32], args=[])
SOFTMAX = EXAMPLES / "cards" / "softmax_f32_small"
BOX1 = "box1 GPU 0 NVIDIA H200 (worker tcp://10.0.0.5:40123)"
BOX2 = "box2 GPU 0 NVIDIA H200 (worker tcp://10.0.0.6:40123)"
LOCAL = "box1 GPU 1 NVIDIA H200"


def measure(store: RunStore, measured_on: str | None, ok: bool = True) -> None:
    """A candidate measured on `measured_on` (or failed before a GPU: `ok` False, no label)."""
    node = store.add_node(None, f"// {len(store.nodes())}", PLAN)
    if ok:
        timing = Timing(median_us=10, p10_us=10, p90_us=10, cv=0.0, reps=5)
        evaluation = Evaluation(
            ok=True, result=EvalResult(ok=True, speedup=1.0, candidate=timing), measured_on=measured_on
        )
        outcome = NodeOutcome(status=NodeStatus.TIMED, latency_us=10, speedup=1.0)
    else:
        evaluation = Evaluation(ok=False, failure="compile", reason="error: expected ';'")
        outcome = NodeOutcome(status=NodeStatus.FAILED, failure="compile", reason=evaluation.reason)
    store.finish_node(node.id, evaluation, outcome, {})


def new_run(root: Path, name: str, labels: list[str | None], gpu_name: str = "NVIDIA H200") -> Path:
    with RunStore.create(root / name, load_card(SOFTMAX), "gpu", gpu_name, RunSettings()) as store:
        for label in labels:
            measure(store, label, ok=label is not None)
    return root / name


@pytest.fixture
def root(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    new_run(runs, "on-cluster", [BOX2, BOX1, BOX2, None, BOX1, BOX2], gpu_name="cluster tcp://10.0.0.5:8786")
    new_run(runs, "one-gpu", [LOCAL, LOCAL])
    new_run(runs, "old", [None, None])  # a run from before the label: nothing says which GPU
    return runs


def test_the_store_counts_evaluations_per_gpu_most_first(root: Path) -> None:
    with RunStore.open(root / "on-cluster", readonly=True) as store:
        assert store.measured_on() == {BOX2: 3, BOX1: 2}  # the failure before a GPU is not counted
        assert list(store.measured_on()) == [BOX2, BOX1]  # the busiest GPU first
    with RunStore.open(root / "old", readonly=True) as store:
        assert store.measured_on() == {}


def test_a_damaged_evaluation_row_is_not_counted_and_breaks_nothing(root: Path) -> None:
    with sqlite3.connect(root / "one-gpu" / DB_NAME) as conn:
        conn.execute("INSERT INTO measurements (node, evaluation, at) VALUES (1, '{not json', 0)")
    with RunStore.open(root / "one-gpu", readonly=True) as store:
        assert store.measured_on() == {LOCAL: 2}


def test_runs_json_has_the_counts_per_gpu(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--root", str(root), "--json"]) == 0
    measured = {r["run_id"]: r["measured_on"] for r in json.loads(capsys.readouterr().out)}
    assert measured == {"on-cluster": {BOX2: 3, BOX1: 2}, "one-gpu": {LOCAL: 2}, "old": {}}


def test_the_runs_table_says_how_many_gpus_measured_each_run(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["runs", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "backend" in line)
    column = [cell.strip() for cell in header.split("┃")].index("GPUs")
    rows = [[cell.strip() for cell in line.split("│")] for line in out.splitlines() if line.count("│") > 5]
    cells = {row[1]: row[column] for row in rows}
    assert cells == {"on-cluster": "2", "one-gpu": "1", "old": "-"}
