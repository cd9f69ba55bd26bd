"""A node becomes the run's best only when it is faster beyond the timing noise, and the run remembers it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.promotion import Champion
from kernelforge_tui.engine.view import describe
from kernelforge_tui.gpu.statistics import robust_stats
from kernelforge_tui.proposers.base import Proposal
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.evaluation import Timing, speedup_text
from kernelforge_tui.vocabulary.events import BestImproved, LogLine
from tests.engine.test_search import Harness, ScriptedProposer, _drain, toy_kernel


def _pair(candidate_us: float, seed: int, noise: float = 0.02) -> tuple[Timing, Timing]:
    rng = np.random.default_rng(seed)
    cand = candidate_us * (1 + rng.normal(0, noise, 30))
    base = 100.0 * (1 + rng.normal(0, noise, 30))
    return robust_stats(list(cand)), robust_stats(list(base))


def test_the_first_timed_node_is_crowned_and_a_slower_one_is_not_considered() -> None:
    champion = Champion()
    first = champion.consider(1, 2.0, _pair(50.0, 1))
    assert first is not None and first.promoted and champion.node_id == 1
    assert champion.consider(2, 1.9, _pair(52.6, 2)) is None
    assert champion.consider(3, None, None) is None
    assert champion.node_id == 1


def test_a_gain_inside_the_noise_is_logged_not_promoted_and_a_real_one_is_promoted() -> None:
    champion = Champion(1, 2.0, _pair(50.0, 1))
    near = champion.consider(2, 2.01, _pair(49.75, 2))
    assert near is not None and not near.promoted
    assert near.gain is not None and near.gain[0] < 1.0 < near.gain[1]
    assert "within the noise, node 1 stays the best" in near.text
    assert champion.node_id == 1
    clear = champion.consider(3, 2.5, _pair(40.0, 3))
    assert clear is not None and clear.promoted and clear.gain is not None and clear.gain[0] > 1.0
    assert champion.node_id == 3 and champion.speedup == 2.5


def test_without_timings_the_point_estimate_decides() -> None:
    champion = Champion(1, 2.0, None)
    verdict = champion.consider(2, 2.01, _pair(49.75, 2))
    assert verdict is not None and verdict.promoted and verdict.gain is None


def _declaring(speedup: float, block: int) -> Proposal:
    """A toy kernel whose simulated speedup is `speedup` (the simulated backend reads the directive)."""
    kernel = toy_kernel(block, 8)
    source = kernel.source.replace(kernel.source.splitlines()[0], f"// kf-simulate: speedup={speedup}")
    return kernel.model_copy(update={"source": source, "mutation": f"declares {speedup}"})


async def _phase(h: Harness, script: list[object], iterations: int) -> tuple[list[BestImproved], list[LogLine]]:
    """One run of the search on the harness's store (a new run, then resumes), with a scripted proposer."""
    h.proposer = ScriptedProposer(script)
    search = h.search(Budget(max_iterations=iterations), expand_batch=4, widening_k=10.0)
    events = search.subscribe()
    await search.run()
    seen = _drain(events)
    search.store.close()
    return [e for e in seen if isinstance(e, BestImproved)], [e for e in seen if isinstance(e, LogLine)]


async def test_the_search_promotes_beyond_the_noise_and_a_resumed_run_keeps_its_best(tmp_path: Path) -> None:
    # The toy seeds declare 1.25 (128, 1) and 1.5 (64, 2). Simulated timings are seeded by the source, so `near`
    # measures a little faster than the 1.5 seed on its point estimate, inside a 1% noise per launch.
    near, clear = _declaring(1.512, 256), _declaring(1.8, 512)
    h = Harness(tmp_path)
    crowned, _ = await _phase(h, [], 2)  # the root and the two seeds
    with RunStore.open(h.run_dir, readonly=True) as store:
        seed = next(n for n in store.nodes() if n.mutation == "block 64, vec 2")
    assert crowned[-1].node_id == seed.id
    crowned, logs = await _phase(h, [[near]], 3)  # a resume: the champion is read back from the store
    with RunStore.open(h.run_dir, readonly=True) as store:
        measured = next(n for n in store.nodes() if n.mutation == near.mutation)
        assert store.run_info().best_node_id == seed.id
    assert measured.speedup is not None and seed.speedup is not None and measured.speedup > seed.speedup
    assert crowned == []
    assert [e.node_id for e in logs if "within the noise" in e.text] == [measured.id]
    crowned, _ = await _phase(h, [[clear]], 4)
    with RunStore.open(h.run_dir, readonly=True) as store:
        best = next(n for n in store.nodes() if n.mutation == clear.mutation)
        info = store.run_info()
    assert [e.node_id for e in crowned] == [best.id] and info.best_node_id == best.id
    assert crowned[0].gain_interval is not None and crowned[0].gain_interval[0] > 1.0
    assert info.best_speedup_interval is not None and best.speedup is not None
    assert info.best_speedup_interval[0] < best.speedup < info.best_speedup_interval[1]
    assert best.speedup_interval == info.best_speedup_interval


def test_views_show_the_interval_beside_the_speedup() -> None:
    event = BestImproved(
        node_id=7, speedup=2.3, latency_us=40.0, speedup_interval=(2.28, 2.33), gain_interval=(1.04, 1.07)
    )
    line = describe(event, None)
    assert line is not None
    assert line.text == "new best: 2.30x (95%: 2.28-2.33), 40.00 us; 1.040-1.070x the previous best's speedup"
    assert speedup_text(2.3, None) == "2.30x"
