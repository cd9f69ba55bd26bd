"""The reward: every term on hand-made parent/child examples, with exact values."""

from __future__ import annotations

import math

import pytest

from kernelforge_tui.engine.reward import Evidence, RewardWeights, compute_reward, failure_reward
from kernelforge_tui.vocabulary.evaluation import PtxasStats

SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
BYTES = "dram__bytes.sum"
OCC = "sm__warps_active.avg.pct_of_peak_sustained_active"


def metrics(sm: float, mem: float, dram: float, dram_bytes: float, occupancy: float) -> dict[str, float]:
    return {SM: sm, MEM: mem, DRAM: dram, BYTES: dram_bytes, OCC: occupancy}


def test_a_bandwidth_win_scores_speed_plus_capped_evidence() -> None:
    parent = Evidence(speedup=1.0, metrics=metrics(10, 25, 25, 200e6, 80), ptxas=PtxasStats(registers=32))
    child = Evidence(speedup=1.6, metrics=metrics(12, 88, 88, 124e6, 75), ptxas=PtxasStats(registers=40))
    reward = compute_reward(child, parent)
    names = [t.name for t in reward.terms]
    assert names == ["speedup", "throughput", "dram_bytes"]  # more registers, but they paid off
    speed = reward.term("speedup")
    assert speed is not None and speed.value == pytest.approx(math.log(1.6))
    raw_throughput = 0.2 * (88 - 25) / 100
    raw_bytes = -0.1 * math.log(124 / 200)
    scale = 0.1 / (raw_throughput + raw_bytes)  # evidence capped at 0.1 in total
    throughput, dram_bytes = reward.term("throughput"), reward.term("dram_bytes")
    assert throughput is not None and throughput.value == pytest.approx(raw_throughput * scale)
    assert dram_bytes is not None and dram_bytes.value == pytest.approx(raw_bytes * scale)
    assert "capped" in throughput.explanation
    assert reward.total == pytest.approx(math.log(1.6) + 0.1)
    assert reward.explanation == (
        "1.60x the parent's speed, DRAM bytes -38%, DRAM throughput 25% -> 88%: "
        "now memory-bandwidth-bound at 88% of peak"
    )


def test_resources_without_a_gain_are_charged() -> None:
    same = metrics(50, 70, 70, 100e6, 90)
    parent = Evidence(speedup=2.0, metrics=same, ptxas=PtxasStats(registers=32, shared_bytes=1024))
    child = Evidence(
        speedup=1.9,
        metrics=same | {OCC: 45.0},
        ptxas=PtxasStats(registers=64, shared_bytes=1024, spill_store_bytes=8, spill_load_bytes=8),
        dynamic_shared=1024,
    )
    reward = compute_reward(child, parent)
    values = {t.name: t.value for t in reward.terms}
    assert values == pytest.approx(
        {
            "speedup": math.log(1.9),
            "throughput": 0.0,
            "dram_bytes": 0.0,
            "registers": -0.1 * math.log(2),
            "shared_memory": -0.1 * math.log(2),
            "spills": -0.2 * math.log(17),
            "occupancy": -0.2 * 0.45,
        }
    )
    assert reward.total == pytest.approx(sum(values.values()))
    assert reward.explanation == (
        "0.95x the parent's speed, registers 32 -> 64 for nothing, shared memory 1024 -> 2048 B for nothing, "
        "spills 0 -> 16 B, occupancy 90% -> 45% cost time: memory-bandwidth-bound at 70% of peak"
    )
    registers = next(t for t in reward.terms if t.name == "registers")
    assert registers.explanation == "registers 32 -> 64 per thread while slower"


def test_a_small_gain_does_not_excuse_resources() -> None:
    parent = Evidence(speedup=1.0, ptxas=PtxasStats(registers=32))
    child = Evidence(speedup=1.01, ptxas=PtxasStats(registers=48))  # under the 2% gain threshold
    reward = compute_reward(child, parent)
    assert [t.name for t in reward.terms] == ["speedup", "registers"]
    assert reward.total == pytest.approx(math.log(1.01) - 0.1 * math.log(1.5))
    assert "no gain" in reward.terms[1].explanation


def test_lower_occupancy_is_free_when_it_is_faster() -> None:
    parent = Evidence(speedup=1.0, metrics=metrics(80, 20, 10, 1e6, 90))
    child = Evidence(speedup=1.3, metrics=metrics(90, 20, 10, 1e6, 40))
    reward = compute_reward(child, parent)
    assert reward.term("occupancy") is None
    assert reward.term("throughput") is not None
    assert reward.term("throughput").value == pytest.approx(0.2 * 0.10)  # type: ignore[union-attr]
    assert reward.explanation == "1.30x the parent's speed: compute-bound at 90% of peak"


def test_a_root_is_scored_alone() -> None:
    reward = compute_reward(Evidence(speedup=1.25))
    assert reward.total == pytest.approx(math.log(1.25))
    assert reward.explanation == "1.25x over the baseline"
    profiled = compute_reward(Evidence(speedup=1.25, metrics=metrics(5, 12, 10, 1e6, 20)))
    assert profiled.total == pytest.approx(math.log(1.25)) and [t.name for t in profiled.terms] == ["speedup"]
    assert profiled.explanation == "memory-latency-bound at 12% of peak"


def test_weights_change_the_terms() -> None:
    weights = RewardWeights(speedup=2.0, evidence_cap=1.0, throughput=1.0)
    parent = Evidence(speedup=1.0, metrics=metrics(10, 40, 40, 1e6, 50))
    child = Evidence(speedup=2.0, metrics=metrics(10, 80, 80, 1e6, 50))
    reward = compute_reward(child, parent, weights=weights)
    assert reward.total == pytest.approx(2 * math.log(2) + 0.4)


def test_failure_reward() -> None:
    reward = failure_reward("mismatch", "set seed_1: 12 of 4096 elements outside rtol")
    assert reward.total == -1.0
    assert reward.terms[0].explanation.startswith("mismatch: set seed_1")
    assert reward.explanation == "failed (mismatch)"
