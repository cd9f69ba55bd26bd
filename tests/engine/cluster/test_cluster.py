"""Searches on a real Dask cluster: a `LocalCluster` of worker processes offering fake GPU resources, nvcc builds
on the workers, the simulated evaluation backend hosted there (CI has no GPU); the store stays in the test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import distributed
import pytest

from kernelforge_tui.config import Settings, load_settings
from kernelforge_tui.engine.bench import BenchManifest
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.cluster.backend import Cluster, ClusterBackend, ClusterUnavailable, GpuSlots
from kernelforge_tui.engine.cluster.remote import Simulation
from kernelforge_tui.engine.search import Search
from kernelforge_tui.gpu.ncu.run import ProfilingUnavailable
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.events import LogLine
from kernelforge_tui.vocabulary.runs import RunInfo
from tests.cli.test_optimize import TOY, kernelforge, kill_9_then_resume
from tests.engine.test_bench_gpus import bench
from tests.engine.test_search import BLOCKS, VECS, Harness, ToyProposer, make_card, run_settings, toy_speedup

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture is made once, on one worker
LANES = "GPU lanes: {} (the cluster's GPUs now)"


def local_cluster(workers: int) -> distributed.LocalCluster:
    cluster = distributed.LocalCluster(
        n_workers=workers,
        threads_per_worker=2,
        processes=True,
        resources={"GPU": 1},
        dashboard_address=":0",
        worker_dashboard_address=":0",
    )
    # every worker known to the scheduler before a test counts GPUs: a search takes the GPUs there are when it starts,
    # and a loaded CI machine once had one of two registered then (a search on one lane, not two)
    if workers:
        cluster.wait_for_workers(workers, timeout=60)
    return cluster


@pytest.fixture(scope="module")
def two_gpus() -> Iterator[str]:
    """A scheduler and two worker processes with one fake GPU each, shared by the tests that do not change it."""
    with local_cluster(2) as cluster:
        yield cluster.scheduler_address


def cluster_settings(**cluster: float) -> Settings:
    settings = load_settings()
    return settings.model_copy(update={"cluster": settings.cluster.model_copy(update={"poll_s": 0.1, **cluster})})


def cluster_search(h: Harness, address: str, budget: Budget, eval_seconds: float, **cluster: float) -> Search:
    settings = cluster_settings(**cluster)
    simulation = Simulation(eval_seconds=eval_seconds)
    backend = ClusterBackend(h.card, settings, Cluster(address, settings), simulation=simulation)
    store = RunStore.create(h.run_dir, h.card, backend.name, backend.gpu_name, run_settings(budget))
    h.store = store
    return Search(h.card, h.proposer, backend, store, run_settings(budget))


def verdicts(store: RunStore) -> dict[str, tuple[str, float | None]]:
    """Each candidate's verdict by its source: status and measured speedup."""
    return {store.node_source(n.id)[0]: (n.status, n.speedup) for n in store.nodes()}


async def test_a_search_on_the_cluster_measures_what_the_local_search_measures(tmp_path: Path, two_gpus: str) -> None:
    local = Harness(tmp_path / "local")
    info = await local.search(Budget()).run()
    assert "nothing left to expand" in info.reason

    remote = Harness(tmp_path / "cluster")
    search = cluster_search(remote, two_gpus, Budget(), eval_seconds=0.05)
    cluster_info = await two_lanes_busy(search)

    assert cluster_info.node_count == info.node_count > 10
    assert verdicts(remote.store) == verdicts(local.store)  # the same candidates, the same numbers
    assert cluster_info.best_speedup == info.best_speedup == pytest.approx(toy_speedup(BLOCKS[-1], VECS[-1]), rel=0.05)
    assert search.pipeline.lanes == 2  # one lane per worker's GPU
    measured = {remote.store.evaluation(n.id).measured_on for n in remote.store.nodes()}  # type: ignore[union-attr]
    assert len(measured) == 2 and all("simulated" in str(m) for m in measured)  # both workers measured
    build = remote.store.evaluation(remote.store.nodes()[1].id).build  # type: ignore[union-attr]
    assert build is not None and build.ok and build.cubin_path is not None and build.cubin_path.is_file()
    local.store.close()
    remote.store.close()


async def test_a_killed_worker_loses_and_duplicates_no_candidate(tmp_path: Path) -> None:
    with local_cluster(2) as cluster:
        h = Harness(tmp_path)
        search = cluster_search(h, cluster.scheduler_address, Budget(), eval_seconds=0.4)
        events = search.subscribe()
        run = asyncio.create_task(search.run())
        async with distributed.Client(cluster.scheduler_address, asynchronous=True) as client:
            victim = await _busy_worker(client)
            pids = await client.run(os.getpid)
            os.kill(pids[victim], signal.SIGKILL)  # mid-evaluation: the nanny starts a new worker process
            info = await asyncio.wait_for(run, 120)
    assert info.node_count > 10 and info.in_flight_count == 0
    assert all(n.status == "timed" for n in h.store.nodes())  # the killed worker's candidate ran again elsewhere
    assert info.gpu_seconds == pytest.approx(info.node_count * 0.4)  # and was counted once
    assert info.best_speedup == pytest.approx(toy_speedup(BLOCKS[-1], VECS[-1]), rel=0.05)
    lanes = [e.text for e in _drain(events) if isinstance(e, LogLine) and e.text.startswith("GPU lanes")]
    assert lanes[0] == LANES.format(1)  # the lost worker's lane went (a worker that comes: the next test)
    h.store.close()


async def test_a_worker_whose_tasks_raise_is_set_aside_and_its_candidates_run_elsewhere(tmp_path: Path) -> None:
    """A GPU worker that raises on every task (its GPU gone, say) fails fast, so it would draw most of the work:
    after `strikes` in a row it gets none, and what it failed runs on the other worker."""

    def lose_the_gpu() -> None:  # runs in the worker process (a nested function travels by value)
        from kernelforge_tui.engine.cluster import remote

        def broken() -> remote.WorkerHost:
            raise RuntimeError("CUDA_ERROR_NO_DEVICE: the GPU fell off the bus")

        remote.host = broken

    with local_cluster(2) as cluster:
        async with distributed.Client(cluster.scheduler_address, asynchronous=True) as client:
            await client.wait_for_workers(2)
            victim = sorted((await client.scheduler.identity())["workers"])[0]
            await client.run(lose_the_gpu, workers=[victim])
        h = Harness(tmp_path)
        search = cluster_search(h, cluster.scheduler_address, Budget(), eval_seconds=0.05, strikes=2)
        events = search.subscribe()
        info = await two_lanes_busy(search)
        backend = search.pipeline.backend
        assert isinstance(backend, ClusterBackend)
        status = backend.cluster.status()
    assert info.node_count > 10 and all(n.status == "timed" for n in h.store.nodes())  # none lost to the fault
    measured = {h.store.evaluation(n.id).measured_on for n in h.store.nodes()}  # type: ignore[union-attr]
    assert len(measured) == 1 and victim not in str(measured)
    why = {w.address: w.set_aside for w in status.workers}
    assert why[victim] is not None and "2 tasks in a row" in why[victim] and "fell off the bus" in why[victim]
    assert [w for w, reason in why.items() if reason is None] != [] and status.gpus == 1
    lanes = [e.text for e in _drain(events) if isinstance(e, LogLine) and e.text.startswith("GPU lanes")]
    assert lanes[-1] == LANES.format(1)
    h.store.close()


async def test_a_retry_goes_to_another_free_gpu_than_the_one_that_failed_it() -> None:
    slots = GpuSlots()
    slots.follow({addr: {"resources": {"GPU": 1}} for addr in ("tcp://a", "tcp://b")})
    async with slots.slot(avoid="tcp://a") as first:
        assert first == "tcp://b"
    async with slots.slot(prefer="tcp://a", avoid="tcp://a") as second:  # its card is there: prefer still wins
        assert second == "tcp://a"
    async with slots.slot(avoid="tcp://b") as held, slots.slot(avoid="tcp://a") as only:  # the only one free
        assert (held, only) == ("tcp://a", "tcp://b")


async def _busy_worker(client: distributed.Client) -> str:
    """A worker while it runs an evaluation (its GPU task), waited for."""
    for _ in range(400):
        processing = await client.processing()
        for worker, keys in processing.items():
            if any(str(key).startswith("evaluate_remote") for key in keys):
                return str(worker)
        await asyncio.sleep(0.05)
    raise AssertionError("no worker ever ran an evaluation")


async def two_lanes_busy(search: Search) -> RunInfo:
    """Run the search held (paused) until two candidates are built, so that both GPUs start at once: evaluations
    that trickle one at a time (slow builds on a loaded machine) would all go to the worker used last."""
    search.pause()
    run = asyncio.create_task(search.run())
    await _until(lambda: sum(n.status == "built" for n in search.store.nodes()) >= 2)
    search.resume()
    return await asyncio.wait_for(run, 120)


async def _until(done: Callable[[], bool], seconds: float = 90.0) -> None:
    """Wait for `done()` (polled), failing after `seconds`."""
    async with asyncio.timeout(seconds):
        while not done():
            await asyncio.sleep(0.05)


def _drain(queue: asyncio.Queue[object]) -> list[object]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


async def test_a_worker_that_joins_mid_search_gets_a_lane(tmp_path: Path) -> None:
    with local_cluster(1) as cluster:
        h = Harness(tmp_path)
        search = cluster_search(h, cluster.scheduler_address, Budget(), eval_seconds=0.2)
        run = asyncio.create_task(search.run())
        await _until(lambda: bool(h.store.nodes()) and h.store.nodes()[0].speedup is not None)
        assert search.pipeline.lanes == 1
        search.pause()  # held until the newcomer is there, however slowly a loaded machine starts it
        cluster.scale(2)
        await _until(lambda: search.pipeline.lanes == 2)
        search.resume()
        info = await asyncio.wait_for(run, 120)
    assert search.pipeline.lanes == 2 and info.node_count > 10
    measured = {h.store.evaluation(n.id).measured_on for n in h.store.nodes()}  # type: ignore[union-attr]
    assert len(measured) == 2  # the newcomer measured some
    h.store.close()


async def test_no_scheduler_is_a_clear_error(tmp_path: Path) -> None:
    settings = cluster_settings(wait_s=1)
    h = Harness(tmp_path)
    backend = ClusterBackend(h.card, settings, Cluster("tcp://127.0.0.1:9", settings), simulation=Simulation())
    with pytest.raises(ClusterUnavailable, match=r"no Dask scheduler answers at tcp://127.0.0.1:9.*dask scheduler"):
        await backend.start()


async def test_a_cluster_without_a_gpu_worker_says_how_to_start_one(tmp_path: Path) -> None:
    with local_cluster(0) as cluster:  # a scheduler alone: no worker, so none with a GPU
        settings = cluster_settings(wait_s=1)
        h = Harness(tmp_path)
        cluster_at = Cluster(cluster.scheduler_address, settings)
        backend = ClusterBackend(h.card, settings, cluster_at, simulation=Simulation())
        no_gpu = r"no worker of the Dask cluster .* offers a GPU after 1 s.*--resources GPU=1"
        with pytest.raises(ClusterUnavailable, match=no_gpu):
            await backend.start()
        await backend.close()


async def test_a_compile_error_and_a_refused_profile_come_back_from_the_workers(tmp_path: Path, two_gpus: str) -> None:
    h = Harness(tmp_path, proposer=ToyProposer())
    settings = cluster_settings()
    backend = ClusterBackend(h.card, settings, Cluster(two_gpus, settings), simulation=Simulation())
    await backend.start()
    try:
        broken = ToyProposer()._make(64, 1)
        source = broken.source.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + undeclared;")
        failed = await backend.evaluate(source, broken.plan)
        assert not failed.ok and failed.failure == "compile" and "undeclared" in failed.reason
        assert failed.build is not None and any(d.line for d in failed.build.diagnostics)
        assert failed.measured_on is None  # it never reached a GPU
        baseline = h.card.spec.baseline
        assert baseline is not None
        with pytest.raises(ProfilingUnavailable, match=r"no ncu numbers are invented.*\(on \S+ simulated \(worker tcp"):
            await backend.profile(h.card.baseline_source(), baseline.plan)  # the worker's refusal, raised here
    finally:
        await backend.close()


def test_optimize_on_a_cluster_from_the_command_line(tmp_path: Path, two_gpus: str) -> None:
    card = make_card(tmp_path / "card")
    run_dir = tmp_path / "run"
    out = kernelforge("optimize", str(card.root), "--simulate", "--cluster", two_gpus, "--budget-iters", "4",
                      "--run-dir", str(run_dir), "--proposer", TOY, "--json", timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout
    info = json.loads(out.stdout)
    assert info["backend"] == "simulated" and info["node_count"] == 5 and f"cluster {two_gpus}" in info["gpu_name"]
    with RunStore.open(run_dir, readonly=True) as store:
        evaluation = store.evaluation(store.nodes()[1].id)
    assert evaluation is not None and "(worker tcp://127.0.0.1:" in str(evaluation.measured_on)
    refused = kernelforge("optimize", str(card.root), "--simulate", "--cluster", "tcp://127.0.0.1:9", "--json",
                          "--run-dir", str(tmp_path / "nowhere"), env={"KERNELFORGE_CLUSTER__WAIT_S": "1"})  # fmt: skip
    assert refused.returncode == 3 and "no Dask scheduler answers at tcp://127.0.0.1:9" in refused.stdout


def test_a_bench_spreads_its_tasks_over_the_cluster_with_the_results_of_one_machine(
    tmp_path: Path, two_gpus: str
) -> None:
    tasks = {"tasks": ["vector_add", "relu"], "precisions": ["float32"], "iterations": 4}
    lines: list[str] = []
    spread = bench(tmp_path / "cluster", 2, lines, cluster=two_gpus, **tasks)
    assert [c.task for c in spread.cards] == ["vector_add", "relu"]
    assert spread.gpus == 2 and all(c.state == "finished" for c in spread.cards)
    starts = [c.started_at or 0 for c in spread.cards]
    ends = [c.ended_at or 0 for c in spread.cards]
    assert max(starts) < min(ends), "the two cards searched at once"
    assert f"2 cards at once on the Dask cluster at {two_gpus} (simulated)" in lines[0]
    assert spread.gpu_name == f"Dask cluster at {two_gpus}"
    measured: set[str | None] = set()
    for card in spread.cards:
        assert card.run_dir is not None
        with RunStore.open(card.run_dir, readonly=True) as store:
            measured |= {store.evaluation(n.id).measured_on for n in store.nodes()}  # type: ignore[union-attr]
    assert len(measured) == 2, "both GPU workers measured"

    one = bench(tmp_path / "local", 1, **tasks)

    def content(manifest: BenchManifest) -> list[tuple[object, ...]]:
        return [(c.card, c.state, c.candidates, c.best_speedup, c.baseline_us, c.best_us) for c in manifest.cards]

    assert content(spread) == content(one)


def test_doctor_checks_the_cluster(two_gpus: str) -> None:
    out = kernelforge("doctor", "--json", "--cluster", two_gpus, timeout=120)
    [check] = [c for c in json.loads(out.stdout) if c["name"] == "cluster"]
    assert check["ok"] and f"{two_gpus}: 2 workers, 2 GPUs, nvcc 1" in check["detail"]
    assert out.returncode in (0, 1)  # the cluster evaluates: no GPU here is no longer exit code 3
    down = kernelforge("doctor", "--json", "--cluster", "tcp://127.0.0.1:9", env={"KERNELFORGE_CLUSTER__WAIT_S": "1"})
    [check] = [c for c in json.loads(down.stdout) if c["name"] == "cluster"]
    assert not check["ok"] and "no Dask scheduler answers" in check["detail"] and "--resources GPU=1" in check["fix"]
    assert down.returncode == 3


def test_a_coordinator_killed_with_kill_9_resumes_on_the_cluster(tmp_path: Path, two_gpus: str) -> None:
    kill_9_then_resume(tmp_path, "--cluster", two_gpus)
