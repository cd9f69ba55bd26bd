"""Taking a kernel away: `engine.takeaway.write_kernel` and `kernelforge show` (files, summary, chart, --json)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from kernelforge_tui.cards import load_card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cards.plan import load_plan
from kernelforge_tui.cli.chart import CEILING, HEIGHT, LEFT, RIGHT, SPEEDUP, WIDTH
from kernelforge_tui.cli.main import main
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.engine.takeaway import progress, write_kernel
from kernelforge_tui.store import RunStore, UnknownNode
from kernelforge_tui.vocabulary.evaluation import EvalResult, Evaluation, SetCheck, Timing
from kernelforge_tui.vocabulary.nodes import FailureKind, NodeOutcome, NodeStatus
from kernelforge_tui.vocabulary.rewards import Reward, RewardTerm
from tests.conftest import EXAMPLES

CARD = EXAMPLES / "cards" / "vector_add_f32"
SOURCE = 'extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) { /* fast */ }\n'
PLAN = LaunchPlan(entry="vadd", grid=["cdiv(n, 1024)"], block=[256], shared_bytes=0, args=["a", "b", "c", "n"])
REWARD = Reward(
    total=1.9,
    terms=[
        RewardTerm(name="speedup", value=1.79, explanation="6.00x over the baseline: 1 x ln(6.000)"),
        RewardTerm(name="dram_bytes", value=0.11, explanation="DRAM bytes -39% (400 -> 244 MB)"),
    ],
    explanation="3.00x the parent's speed, DRAM bytes -39%",
)


def _timed(latency: float, speedup: float) -> Evaluation:
    checks = [SetCheck(name=name, ok=True) for name in ("seed_1", "fresh-0", "stress:nan-inf", "seed_1 (second run)")]
    result = EvalResult(
        ok=True,
        checks=checks,
        deterministic=True,
        candidate=Timing(median_us=latency, p10_us=latency * 0.98, p90_us=latency * 1.03, cv=0.012, reps=40),
        baseline=Timing(median_us=latency * speedup, p10_us=1.0, p90_us=1.0, cv=0.01, reps=40),
        speedup=speedup,
        speedup_interval=(speedup * 0.97, speedup * 1.02),
        gpu_seconds=0.1,
    )
    return Evaluation(ok=True, result=result, ceiling_share=0.81)


def make_run(tmp_path: Path, backend: str = "gpu", gpu: str = "NVIDIA H200") -> RunStore:
    """A run of the vector-add card: the baseline (node 1), a faster child (node 2, the best), a failed child (3)."""
    store = RunStore.create(tmp_path / "runs" / "run-a", load_card(CARD), backend, gpu, RunSettings())
    root = store.add_node(None, "// baseline\n", PLAN, mutation="baseline", proposer="baseline")
    fast = store.add_node(
        root.id, SOURCE, PLAN, mutation="vector width 1 -> 4", proposer="templates", params={"vec": 4}
    )
    bad = store.add_node(root.id, "// broken\n", PLAN, mutation="block 256 -> 2048", proposer="templates")
    store.finish_node(root.id, _timed(300.0, 1.0), NodeOutcome(status=NodeStatus.TIMED, speedup=1.0), {})
    best = NodeOutcome(
        status=NodeStatus.TIMED,
        latency_us=50.0,
        speedup=6.0,
        speedup_interval=(5.82, 6.12),
        ceiling_share=0.81,
        reward=REWARD,
        best=True,
    )
    store.finish_node(fast.id, _timed(50.0, 6.0), best, {})
    failed = Evaluation(ok=False, failure=FailureKind.MISMATCH, reason="set seed_1: 12 elements differ")
    store.finish_node(
        bad.id, failed, NodeOutcome(status=NodeStatus.FAILED, failure=FailureKind.MISMATCH, reason=failed.reason), {}
    )
    return store


def test_write_kernel_writes_source_plan_and_a_summary(tmp_path: Path) -> None:
    with make_run(tmp_path) as store:
        out = write_kernel(store, 2, tmp_path / "out")
    assert out == tmp_path / "out"
    assert (out / "kernel.cu").read_text() == SOURCE
    assert load_plan(out / "plan.toml") == PLAN  # the card tooling reads it back as the same plan
    summary = (out / "summary.md").read_text()
    for words in (
        "vector_add_f32",  # card
        "node 2",
        "6.00x (95%: 5.82-6.12)",  # speedup with its interval
        "81% of the measured ceiling",
        "50 us median (p10 49, p90 51.5)",  # latency with its spread
        "NVIDIA H200",
        "GPU (measured)",
        "the run's best",
        "3 input sets: seed_1, fresh-0, stress:nan-inf",  # checks passed
        "deterministic",
        "3.00x the parent's speed, DRAM bytes -39%",  # the reward explanation and its terms
        "dram_bytes +0.11: DRAM bytes -39% (400 -> 244 MB)",
        "run run-a",  # provenance
        "proposer templates; mutation: vector width 1 -> 4",
        "vec=4",
        "kernelforge eval",
    ):
        assert words in summary, words
    assert "SIMULATED" not in summary


def test_a_simulated_run_says_so_and_a_failed_node_is_not_called_correct(tmp_path: Path) -> None:
    with make_run(tmp_path, backend="simulated", gpu="simulated (no GPU)") as store:
        simulated = (write_kernel(store, 2, tmp_path / "sim") / "summary.md").read_text()
        failed = (write_kernel(store, 3, tmp_path / "failed") / "summary.md").read_text()
    assert "SIMULATED run: the timings are invented" in simulated
    assert "backend | SIMULATED" in simulated
    assert "Not proven correct: the node is failed (mismatch: set seed_1: 12 elements differ)" in failed
    assert "none: the kernel was not proven correct" in failed


def test_unknown_node_is_named(tmp_path: Path) -> None:
    with make_run(tmp_path) as store, pytest.raises(UnknownNode, match="no node 99 in run run-a"):
        write_kernel(store, 99, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_progress_is_the_best_so_far_over_candidates(tmp_path: Path) -> None:
    with make_run(tmp_path) as store:
        points = progress(store)
    assert [(p.candidates, p.best_speedup, p.best_ceiling_share) for p in points] == [
        (1, 1.0, None),  # the baseline's outcome records no ceiling share
        (2, 6.0, 0.81),
        (3, 6.0, 0.81),  # a failure is a candidate spent, and changes no best
    ]


# ---- kernelforge show ----------------------------------------------------------------------------------------


def read_png(path: Path) -> npt.NDArray[np.uint8]:
    """An 8-bit RGB PNG with filter 0 on every row (what cli.chart writes), checked chunk by chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length : at + 12 + length])[0] == zlib.crc32(kind + body)
        chunks[kind] = body
        at += 12 + length
    width, height, depth, color, *_ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, color) == (8, 2) and b"IEND" in chunks
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8).reshape(height, 1 + width * 3)
    assert not rows[:, 0].any()
    return rows[:, 1:].reshape(height, width, 3)


def test_show_writes_the_best_kernel_and_a_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(tmp_path).close()
    monkeypatch.chdir(tmp_path)
    assert main(["show", str(tmp_path / "runs" / "run-a")]) == 0
    out = capsys.readouterr().out
    assert "# vector_add_f32: node 2 (the run's best)" in out and "6.00x (95%: 5.82-6.12)" in out
    written = tmp_path / "run-a-node-2"  # the default directory: RUN-node-N here
    assert sorted(p.name for p in written.iterdir()) == ["kernel.cu", "plan.toml", "progress.png", "summary.md"]
    image = read_png(written / "progress.png")
    assert image.shape == (HEIGHT, WIDTH, 3)
    blue = np.all(image == SPEEDUP, axis=2)
    orange = np.all(image == CEILING, axis=2)
    assert orange.any()
    left, right = np.nonzero(blue[:, LEFT + 20])[0], np.nonzero(blue[:, WIDTH - RIGHT - 20])[0]
    assert left.min() > right.min() + 100  # 1x after the first candidate, 6x after the second: the line rises


def test_show_a_node_as_json_into_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(tmp_path).close()
    assert main(["show", str(tmp_path / "runs" / "run-a"), "3", "-o", str(tmp_path / "k"), "--json"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply["node_id"] == 3 and reply["status"] == "failed" and reply["checks"] == []
    assert reply["files"][0] == str(tmp_path / "k" / "kernel.cu")
    assert (tmp_path / "k" / "kernel.cu").read_text() == "// broken\n"


@pytest.mark.parametrize(
    ("node", "words"),
    [("abc", "node 'abc' is not a node id: give a number"), ("99", "no node 99 in run run-a")],
)
def test_show_names_a_bad_node(tmp_path: Path, capsys: pytest.CaptureFixture[str], node: str, words: str) -> None:
    make_run(tmp_path).close()
    assert main(["show", str(tmp_path / "runs" / "run-a"), node, "-o", str(tmp_path / "k"), "--json"]) == 2
    assert words in json.loads(capsys.readouterr().out)["message"]
    assert not (tmp_path / "k").exists()


def test_show_of_a_recorded_example_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run recorded on the H200 by an older kernelforge (no speedup interval): the spread stands in for it."""
    run = EXAMPLES / "runs" / "rms_norm_bf16_profiled"
    assert main(["show", str(run), "-o", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    assert "19.34x over the card's baseline (no interval recorded; kernel time spread p10-p90" in out
    assert "memory-bandwidth-bound at 76% of peak" in out and "dram_bytes" in out
    assert load_plan(tmp_path / "k" / "plan.toml").entry == "kf_rms_norm"
