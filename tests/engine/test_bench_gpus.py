"""`kernelforge bench --gpus N` on the simulated backend: two cards searched at once, each recording its own GPU, with
the same cards, states and numbers as one GPU gives; a task's minutes shared as on one GPU; `kill -9` with two cards
in flight, then the same command finishes both; and a run pinned to one GPU evaluates there (its worker's device).
Only vector_add at 2^10 runs, so the file stays fast."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cli.bench_report import write_report
from kernelforge_tui.cli.main import main
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine import setup
from kernelforge_tui.engine.backend import GpuBackend
from kernelforge_tui.engine.bench import RUNS, BenchManifest, BenchOptions, load_manifest, run_bench
from kernelforge_tui.engine.setup import RunOptions, make_backend
from kernelforge_tui.errors import BadInput
from kernelforge_tui.gpu.detect import GpuInfo, NoGpuError
from kernelforge_tui.store import RunStore
from kernelforge_tui.suite import cards, registry

ROOT = Path(__file__).resolve().parents[2]
SMALL = 2**10
CARDS = ("vector_add_fp32_s10", "vector_add_bf16_s10")


def bench(out: Path, gpus: int, lines: list[str] | None = None, **options: object) -> BenchManifest:
    chosen = BenchOptions(
        tasks=["vector_add"], scales=[SMALL], simulate=True, simulate_seconds=0.2, max_gpus=gpus
    ).model_copy(update=options)
    progress = None if lines is None else (lambda _m, line: lines.append(line))
    return asyncio.run(run_bench(out, load_settings(), chosen, progress))


def test_two_gpus_search_two_cards_at_once_and_report_what_one_gpu_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[str] = []
    two = bench(tmp_path / "two", 2, lines, iterations=4)
    assert two.gpus == 2 and [c.card for c in two.cards] == list(CARDS)
    assert {c.gpu for c in two.cards} == {0, 1}, "each card's run on its own GPU"
    starts = [c.started_at or 0 for c in two.cards]
    ends = [c.ended_at or 0 for c in two.cards]
    assert max(starts) < min(ends), "the two cards overlap in time"
    searching = [i for i, line in enumerate(lines) if ": searching" in line]
    finished = [i for i, line in enumerate(lines) if ": finished" in line]
    assert len(searching) == 2 and max(searching) < min(finished), "both started before either finished"
    assert {f"{c.card} on GPU {c.gpu}: searching" for c in two.cards} <= {line.split(" (")[0] for line in lines}
    assert "2 cards at once, one on each of simulated GPUs 0, 1" in lines[0]

    one = bench(tmp_path / "one", 1, iterations=4)
    assert one.gpus == 1 and [c.gpu for c in one.cards] == [0, 0]
    first, second = one.cards
    assert (first.ended_at or 0) <= (second.started_at or 0), "one GPU: one card after the other"

    def content(manifest: BenchManifest) -> list[tuple[object, ...]]:
        return [(c.card, c.state, c.candidates, c.best_speedup, c.baseline_us, c.best_us) for c in manifest.cards]

    assert content(two) == content(one) and all(c.state == "finished" for c in two.cards)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the numbers are compared, not the plots (slow to draw)
    reports = [write_report(two, tmp_path / "two"), write_report(one, tmp_path / "one")]
    summaries = [json.loads((report / "results.json").read_text()) for report in reports]
    assert summaries[0]["cards"] == summaries[1]["cards"] and summaries[0]["suite_score"] == summaries[1]["suite_score"]
    assert "2 cards at once (one per GPU)" in (reports[0] / "report.md").read_text()


def test_cards_side_by_side_get_the_minutes_one_gpu_would_give(tmp_path: Path) -> None:
    """The task's 2 minutes: the first card gets half of what is left after the second's allowance (0.6 + 0.25 of
    start-up), the second, started while the first runs, counts the first's whole share as spent (0.9 + 0.25)."""
    two = bench(tmp_path / "two", 2, iterations=1, minutes_per_task=2.0, simulate_seconds=0.01)
    minutes = [c.budget.max_minutes if c.budget else None for c in two.cards]
    assert minutes == [pytest.approx(0.6), pytest.approx(0.9)]
    assert sum(m or 0 for m in minutes) + 2 * 0.25 == pytest.approx(2.0), "the task's minutes, not twice them"


def _states(out: Path) -> dict[str, str]:
    try:
        return {c.card: c.state for c in load_manifest(out).cards}
    except BadInput:  # not written yet
        return {}


def _measured(run_dir: Path) -> int:
    if not (run_dir / "run.sqlite").exists():
        return 0
    with RunStore.open(run_dir, readonly=True) as store:
        info = store.run_info()
    return info.node_count - info.in_flight_count


def test_kill_9_with_two_cards_in_flight_then_rerun_finishes_both(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["bench", "--simulate", "--gpus", "2", "--tasks", "vector_add", "--scales", "10", "--budget-iters", "4"]
    # a second a simulated evaluation: both cards stay in flight for seconds, so the poll catches them together even
    # when one starts late on a loaded machine (at 0.3 s, one once finished before the other had measured two)
    args += ["--simulate-seconds", "1.0", "-o", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelforge_tui.cli", *args, "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            states = _states(out)
            if all(states.get(c) == "running" and _measured(out / RUNS / c) >= 2 for c in CARDS):
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the bench and any nvcc it started
        proc.wait()
    killed = load_manifest(out)
    assert [c.state for c in killed.cards] == ["running", "running"]
    assert {c.gpu for c in killed.cards} == {0, 1}
    measured_before = {}
    for name in CARDS:
        with RunStore.open(out / RUNS / name, readonly=True) as store:
            measured_before[name] = {n.id: n.speedup for n in store.nodes() if n.speedup is not None}

    rerun = subprocess.run(
        [sys.executable, "-m", "kernelforge_tui.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    resumed = re.findall(r"(\w+) on GPU (\d): resuming its run", rerun.stdout)
    assert sorted(name for name, _ in resumed) == sorted(CARDS) and {gpu for _, gpu in resumed} == {"0", "1"}
    assert ": searching" not in rerun.stdout, "both cards were in flight: resumed, none started afresh"
    done = load_manifest(out)
    assert [c.state for c in done.cards] == ["finished", "finished"]
    for name in CARDS:
        with RunStore.open(out / RUNS / name, readonly=True) as store:
            after = {n.id: n.speedup for n in store.nodes()}
            assert store.run_info().node_count == 5  # its 4 candidates over both sessions, and the baseline
        assert all(after[i] == s for i, s in measured_before[name].items()), "what was measured is kept"


def test_a_run_pinned_to_one_gpu_evaluates_there_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`RunOptions.gpus` picks GPUs by nvidia-smi index: the backend's one evaluator, and its worker's device."""
    h200 = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-0", capability="9.0", driver="580", memory_mib=143771)
    monkeypatch.setattr(setup, "require_gpu", lambda: [h200, h200.model_copy(update={"index": 1, "uuid": "GPU-1"})])
    card: Card = cards.write(registry.task("vector_add"), "float32", SMALL, tmp_path)
    backend = make_backend(card, load_settings(), RunOptions(gpus=[1]))
    assert isinstance(backend, GpuBackend) and backend.lanes == 1 and backend.gpu_name == "NVIDIA H200"
    (evaluator,) = backend.evaluators
    assert evaluator.gpu.uuid == "GPU-1" and evaluator.worker.gpu_index == 1
    unpinned = make_backend(card, load_settings(), RunOptions())
    assert isinstance(unpinned, GpuBackend) and len(unpinned.evaluators) == 2, "unpinned: every GPU"
    with pytest.raises(NoGpuError, match="no GPU with index 2 here"):
        make_backend(card, load_settings(), RunOptions(gpus=[2]))


def test_gpus_must_be_one_or_more(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--simulate", "--gpus", "0", "--tasks", "vector_add"]) == BadInput.exit_code
    assert "--gpus 0: give 1 or more GPUs" in capsys.readouterr().out
