"""`kernelforge optimize` and `kernelforge runs` as real subprocesses: JSON output, errors, kill -9 and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelforge_tui.gpu.detect import detect_gpus
from kernelforge_tui.store import RunStore
from tests.engine.test_search import BASELINE, make_card

ROOT = Path(__file__).resolve().parents[2]
TOY = "tests.engine.test_search:ToyProposer"


def kernelforge(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernelforge_tui.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=os.environ | {"COLUMNS": "200"} | (env or {}))  # fmt: skip


def test_optimize_simulated_json_then_runs_lists_it(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    run_dir = tmp_path / "runs" / "first"
    out = kernelforge("optimize", str(card.root), "--simulate", "--budget-iters", "5", "--run-dir", str(run_dir),
                      "--proposer", TOY, "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout
    info = json.loads(out.stdout)
    assert info["backend"] == "simulated" and info["state"] == "finished" and info["node_count"] == 6
    assert info["best_speedup"] > 1.0 and "iteration budget" in info["reason"]
    listed = kernelforge("runs", "--root", str(tmp_path / "runs"), "--json")
    assert listed.returncode == 0
    [row] = json.loads(listed.stdout)
    assert row["run_id"] == "first" and row["best_node_id"] == info["best_node_id"]
    table = kernelforge("runs", "--root", str(tmp_path / "runs"))
    assert "first" in table.stdout and "simulated" in table.stdout


def test_optimize_live_view_says_simulated(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    out = kernelforge("optimize", str(card.root), "--simulate", "--budget-iters", "3", "--root",
                      str(tmp_path / "runs"), "--proposer", TOY)  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout
    assert "SIMULATED" in out.stdout and "best (simulated)" in out.stdout and "--resume" in out.stdout


@pytest.mark.skipif(bool(detect_gpus()), reason="this machine has a GPU")
def test_optimize_without_gpu_or_simulate_is_a_clear_error(tmp_path: Path) -> None:
    card = make_card(tmp_path / "card")
    out = kernelforge("optimize", str(card.root), "--budget-iters", "3", "--root", str(tmp_path / "runs"), "--json")
    assert out.returncode == 3
    error = json.loads(out.stdout)
    assert error["error"] == "no-gpu" and "--simulate" in error["message"]
    assert not (tmp_path / "runs").exists()  # no empty run left behind


def test_bad_inputs_are_usage_errors(tmp_path: Path) -> None:
    out = kernelforge("optimize", "--simulate", "--json")
    assert out.returncode == 2 and "CARD" in json.loads(out.stdout)["message"]
    out = kernelforge("optimize", "--simulate", "--resume", "nope", "--root", str(tmp_path), "--json")
    assert out.returncode == 2 and "no run" in json.loads(out.stdout)["message"]
    card = make_card(tmp_path / "card")
    out = kernelforge("optimize", str(card.root), "--simulate", "--tree", "bogus=1", "--json")
    assert out.returncode == 2 and "KEY=VALUE" in json.loads(out.stdout)["message"]
    out = kernelforge("optimize", str(card.root), "--simulate", "--proposer", "no_such_module:Proposer", "--json")
    error = json.loads(out.stdout)
    assert out.returncode == 2 and error["error"] == "bad-input" and "cannot be loaded" in error["message"]


def test_a_failing_baseline_is_exit_code_1(tmp_path: Path) -> None:
    fails = make_card(tmp_path / "fails")
    (fails.root / "baseline.cu").write_text(BASELINE + "// kf-simulate: fail=mismatch\n")
    runs = str(tmp_path / "runs")
    out = kernelforge("optimize", str(fails.root), "--simulate", "--budget-iters", "3", "--root", runs, "--json")
    error = json.loads(out.stdout)
    assert out.returncode == 1 and error["error"] == "failed"
    assert "the card's baseline failed to evaluate (mismatch)" in error["message"]
    broken = make_card(tmp_path / "broken")
    (broken.root / "baseline.cu").write_text(BASELINE.replace("c[i] = a[i] + b[i];", "c[i] = a[i] +;"))
    out = kernelforge("optimize", str(broken.root), "--simulate", "--budget-iters", "3", "--root", runs, "--json")
    assert out.returncode == 1 and "the card's baseline kernel does not build" in json.loads(out.stdout)["message"]


def test_runs_with_no_runs(tmp_path: Path) -> None:
    out = kernelforge("runs", "--root", str(tmp_path / "empty"))
    assert out.returncode == 0 and "no runs" in out.stdout


def _counts(run_dir: Path) -> tuple[int, int]:
    """(nodes, measured or failed nodes) as a concurrent reader sees them."""
    with RunStore.open(run_dir, readonly=True) as store:
        nodes = store.nodes()
    return len(nodes), sum(n.status not in ("proposed", "built") for n in nodes)


def test_kill_9_mid_run_then_resume_loses_nothing(tmp_path: Path) -> None:
    kill_9_then_resume(tmp_path)


def kill_9_then_resume(tmp_path: Path, *where: str) -> None:
    """A search killed with SIGKILL mid-run, then resumed to its budget: nothing committed is lost or redone.
    `where`: the backend's options for both commands (`--cluster ADDRESS`; this machine's simulation without)."""
    card = make_card(tmp_path / "card")
    run_dir = tmp_path / "runs" / "crashy"
    budget = "11"  # the toy space has 12 kernels: the run ends on the budget, not on an exhausted tree
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelforge_tui.cli", "optimize", str(card.root), "--simulate", "--budget-iters",
         budget, "--simulate-seconds", "0.3", "--run-dir", str(run_dir), "--proposer", TOY, "--json", *where],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    seen: list[int] = []
    deadline = time.time() + 40
    try:
        while time.time() < deadline:  # a concurrent reader in this process while the subprocess writes
            if (run_dir / "run.sqlite").exists():
                with RunStore.open(run_dir, readonly=True) as store:
                    info = store.run_info()
                seen.append(info.node_count)
                if info.node_count - info.in_flight_count >= 4:
                    break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the search and any nvcc it started
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert seen == sorted(seen)  # the reader only ever saw the run grow
    before = RunStore.open(run_dir, readonly=True)
    committed = {n.id: n for n in before.nodes()}
    assert before.run_info().state == "interrupted"
    before.close()
    nodes, done = _counts(run_dir)
    assert done >= 4 and done < 12 and nodes == len(committed)

    out = kernelforge("optimize", "--resume", str(run_dir), "--simulate", "--json", *where, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    info = json.loads(out.stdout)
    assert info["state"] == "finished" and "iteration budget" in info["reason"]
    assert info["node_count"] == int(budget) + 1 and info["in_flight_count"] == 0
    with RunStore.open(run_dir, readonly=True) as store:
        after = {n.id: n for n in store.nodes()}
    for node_id, node in committed.items():  # nothing committed is lost; measured nodes are not redone
        assert node_id in after
        if node.status == "timed":
            assert after[node_id].speedup == node.speedup and after[node_id].latency_us == node.latency_us
    assert all(n.status == "timed" for n in after.values())
