"""bench/compile_path.py without a GPU: a block whose later step fails keeps what its earlier steps measured (the
H100's run of 2026-12-07 lost six blocks' timings to a failure in the host-cost step after them), its table rows
and its error are both written, and a rerun measures it again instead of taking it as done.

The GPU steps themselves (capture on CUDA, the modes' timing) are `bench_block`'s, stood in for here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.scripts import load_script

pytest.importorskip("torch", reason="the bench imports torch (CI installs it: .ci/run)")

ROOT = Path(__file__).resolve().parents[2]


bench = load_script(ROOT / "bench" / "compile_path.py")


def _timing(us: float) -> dict[str, Any]:
    spread = {"median_us": us, "p10_us": us * 0.9, "p90_us": us * 1.1}
    return {"device": spread, "wall": spread, "host": spread, "back_to_back": spread}


def test_a_block_that_fails_after_its_timing_keeps_it_and_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def measured_then_failed(block: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
        calls.append(block)
        report.update(package="m.cast", kernels=[], workload=block)
        report["timing"] = {"eager": _timing(200.0), "kf": _timing(100.0)}
        diff = {"max_abs_diff": 0.01, "mean_abs_diff": 0.001, "within_tolerance": True, "first_call_s": 1.0}
        report["outputs"] = {"eager": diff, "kf": diff}
        raise StopIteration  # what the host-cost step raised for a chain's kernel

    monkeypatch.setattr(bench, "bench_block", measured_then_failed)
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), "--work", str(tmp_path / "work"), "--blocks", "decoder"]) == 1
    report = json.loads((out / "decoder.json").read_text())
    assert report["timing"]["kf"]["back_to_back"]["median_us"] == 100.0 and "StopIteration" in report["error"]
    rows = (out / "compile_path.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[2].startswith("decoder,kf,") and ",2.0," in rows[2]  # 2x eager, back to back
    assert "StopIteration" in (out / "compile_path.md").read_text()
    bench.main(["--out", str(out), "--work", str(tmp_path / "work"), "--blocks", "decoder"])
    assert calls == ["decoder", "decoder"]  # a block with an error is not done: the rerun measures it again
