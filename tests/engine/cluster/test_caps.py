"""The `[build]` caps on a cluster: what the coordinator sends its workers, and the builders the workers make of it
(no scheduler: the client is a stand-in that runs each task here, as a worker would)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build.nvcc import Builder, build_failure
from kernelforge_tui.config import BuildSettings, Settings
from kernelforge_tui.engine.backend import make_builder
from kernelforge_tui.engine.cluster import remote
from kernelforge_tui.engine.cluster.backend import Cluster, ClusterBuilder
from kernelforge_tui.engine.cluster.remote import ShippedBuilder, Toolchain, compile_remote
from kernelforge_tui.vocabulary.evaluation import BuildResult

VERSION = "13.0.88"
CAPS = {"max_log_bytes": 2048, "max_diagnostics": 3, "max_global_bytes": 64}
SOURCE = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'


class TaskClient:
    """A `distributed.Client` that runs each submitted task in a thread here, and keeps what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, task: Callable[..., Any], *args: Any, pure: bool = True) -> Any:
        self.sent.append((task, args))
        return asyncio.to_thread(task, *args)


class StandInCluster(Cluster):
    def __init__(self, settings: Settings) -> None:
        super().__init__("tcp://stand-in:8786", settings)
        self.tasks = TaskClient()
        self._version = VERSION

    async def client(self) -> Any:
        return self.tasks


def capped() -> Settings:
    return Settings(build=BuildSettings(**CAPS))


def caps_of(builder: Builder | Toolchain) -> dict[str, int]:
    return {name: getattr(builder, name) for name in CAPS}


async def test_a_build_task_holds_nvcc_to_the_coordinators_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = capped()
    cluster = StandInCluster(settings)
    on_the_worker: list[Builder] = []

    async def compiled(builder: Builder, toolchain: Toolchain, source: str, key: str) -> BuildResult:
        on_the_worker.append(builder)
        return build_failure(key, "compile error", "stand-in")

    monkeypatch.setattr(remote, "_compile_checked", compiled)
    coordinator = ClusterBuilder(cluster, settings, "sm_90")
    assert caps_of(coordinator) == CAPS  # its cache keys and what it stores are bounded by them
    await coordinator.compile("nvcc", SOURCE, "sm_90", "key")
    [(task, (toolchain, source, key))] = cluster.tasks.sent
    assert task is compile_remote and (source, key) == (SOURCE, "key")
    assert caps_of(toolchain) == CAPS
    assert [caps_of(b) for b in on_the_worker] == [CAPS]


async def test_a_gpu_worker_finds_the_builds_shipped_under_other_caps(tmp_path: Path) -> None:
    settings = capped()
    coordinator = ClusterBuilder(StandInCluster(settings), settings, "sm_90")
    key = coordinator.cache_key(SOURCE, "k", "sm_90", VERSION)
    assert key == make_builder(settings, "sm_90").cache_key(SOURCE, "k", "sm_90", VERSION)  # a local search's
    worker = ShippedBuilder(coordinator.chain(VERSION), tmp_path / "worker")
    worker.remember(BuildResult(ok=True, key=key), b"\x7fELF shipped")
    found = await worker.build(SOURCE, "k")
    assert found.ok and found.cached and found.key == key, found.log
