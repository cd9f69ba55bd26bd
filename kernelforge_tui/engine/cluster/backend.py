"""The cluster backend: one search's builds and evaluations on a Dask cluster, its store kept here.

The coordinator (this process) keeps everything a local search keeps: the tree, the one writer of the run store,
the cubin cache. The cluster does the work. nvcc builds are CPU tasks that run on any worker (the cubin comes back
as bytes and is cached here by its content hash); evaluations and profiles are tasks that need the `GPU` resource,
which a worker offers once per GPU it owns (`dask worker ... --resources GPU=1`, one worker per GPU). Each such
worker hosts the card as a local search would (`remote.HostedCard`), so the checks and the timing are the same.

Why Dask and not a scheduler of our own: it already re-runs the tasks of a worker that died on another worker
(so a lost GPU loses no candidate, and a task's result is taken once, so none is counted twice), queues tasks
until a worker with a free GPU is there, and lets workers come and go. What this module adds is the GPU lanes
the search sees: as many as the GPU resources on the cluster now, so the tree proposes only as far ahead of the
GPUs as it would on one machine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from kernelforge_tui.build.nvcc import DEFAULT_ARCH, Builder, build_failure
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.config import Settings
from kernelforge_tui.engine.backend import EVALUATING, SIMULATED, prebuild
from kernelforge_tui.engine.cluster.remote import (
    CardPackage,
    Hosting,
    ShippedBuild,
    Simulation,
    Toolchain,
    Verdict,
    compile_remote,
    evaluate_remote,
    identify,
    nvcc_here,
    pack_card,
    profile_remote,
    vendor_remote,
)
from kernelforge_tui.errors import BadInput, BaselineFailed, NoGpu
from kernelforge_tui.gpu.evaluate import build_candidate, build_error, helpers_source
from kernelforge_tui.gpu.ncu.run import (
    NcuMissing,
    NcuNotPermitted,
    NcuUnsupported,
    ProfileError,
    ProfileFailed,
    ProfileTimeout,
    ProfilingUnavailable,
)
from kernelforge_tui.gpu.ncu.service import build_for_profile
from kernelforge_tui.suite.vendor_timing import VendorReply, VendorRequest
from kernelforge_tui.vocabulary.evaluation import BuildResult, Ceilings, Evaluation
from kernelforge_tui.vocabulary.profiles import NodeProfile
from kernelforge_tui.vocabulary.runs import ClusterStatus, WorkerStatus

T = TypeVar("T")

GPU = "GPU"
"""The Dask resource a worker offers per GPU it owns, and every evaluation and profile asks for."""
DASK_MISSING = "the cluster backend needs Dask: pip install 'kernelforge-tui[cluster]' (dask distributed)"
_REFUSALS: dict[str, type[ProfileError]] = {
    cls.__name__: cls
    for cls in (NcuMissing, NcuNotPermitted, NcuUnsupported, ProfileTimeout, ProfilingUnavailable, ProfileFailed)
}


def gpus_of(worker: dict[str, Any]) -> int:
    """The GPU resources a worker offers, from the scheduler's identity of it (0: a CPU worker)."""
    return int(worker.get("resources", {}).get(GPU, 0))


def worker_command(address: str) -> str:
    """How to start one GPU worker (README's way): its other threads build, so give it the cores of its GPU."""
    return f"CUDA_VISIBLE_DEVICES=N dask worker {address} --nthreads CORES_PER_GPU --resources GPU=1"


class WorkerFault(Exception):
    """A task raised on its GPU worker: the worker's fault, not the candidate's (failing candidates are evaluations)."""

    def __init__(self, worker: str, error: Exception) -> None:
        super().__init__(f"on cluster worker {worker}: {type(error).__name__}: {error}")
        self.worker = worker
        self.error = error


class ClusterUnavailable(NoGpu):
    """No scheduler at the address, or no worker there with a GPU: the message says how to start one."""


class Cluster:
    """One connection to a scheduler, shared by every search of this process (a bench runs several at once)."""

    def __init__(self, address: str, settings: Settings) -> None:
        self.address = address
        self.settings = settings.cluster
        self._client: Any = None
        """A `distributed.Client` (Dask is an optional extra, and only partly typed)."""
        self._workers: dict[str, dict[str, Any]] = {}
        self._changed = asyncio.Event()
        self._connecting = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._version: str | None = None
        self.slots = GpuSlots()
        """The GPUs, shared by every search of this process that uses the cluster."""
        self.running: dict[str, list[str]] = collections.defaultdict(list)
        """Worker address -> what its GPUs work on now (`card #node`)."""
        self.finished: collections.Counter[str] = collections.Counter()
        """Worker address -> evaluations it finished for this process."""
        self.set_aside: dict[str, str] = {}
        """Worker address -> why its GPUs get no more work (`[cluster] strikes` failed tasks in a row)."""
        self._strikes: collections.Counter[str] = collections.Counter()
        self._since = time.monotonic()

    async def client(self) -> Any:
        """The client, connected at the first call (the address is checked then, with a clear error)."""
        async with self._connecting:  # the searches of a bench start at once: one connection for them all
            if self._client is None:
                await self._connect()
        return self._client

    async def _connect(self) -> None:
        try:
            import distributed
        except ImportError:
            raise BadInput(DASK_MISSING) from None
        connect: Any = distributed.Client
        try:
            self._client = await connect(self.address, asynchronous=True, timeout=self.settings.wait_s)
        except (OSError, TimeoutError) as exc:
            raise ClusterUnavailable(
                f"no Dask scheduler answers at {self.address} ({exc}): start one with `dask scheduler` and give "
                "its address (tcp://host:8786) to --cluster"
            ) from None
        await self._refresh()
        self._watcher = asyncio.create_task(self._watch(), name="cluster-watch")

    async def _refresh(self) -> None:
        assert self._client is not None
        identity = await self._client.scheduler.identity()
        workers: dict[str, dict[str, Any]] = identity.get("workers", {})
        changed = set(workers) != set(self._workers) or self.gpus(workers) != self.gpus()
        self._workers = workers
        self.slots.follow(self._usable(workers))
        if changed:
            self._changed.set()

    async def _watch(self) -> None:
        """Ask the scheduler for its workers every `poll_s` (workers come and go; the lanes follow)."""
        while True:
            await asyncio.sleep(self.settings.poll_s)
            with contextlib.suppress(Exception):  # a scheduler that is away (restarting) is asked again next time
                await self._refresh()

    def gpus(self, workers: dict[str, dict[str, Any]] | None = None) -> int:
        """How many GPU resources the cluster's workers offer now (those set aside left out)."""
        found = self._usable(self._workers if workers is None else workers)
        return sum(gpus_of(w) for w in found.values())

    def _usable(self, workers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {addr: w for addr, w in workers.items() if addr not in self.set_aside}

    def _struck(self, worker: str, error: Exception) -> None:
        """A task raised on `worker`: after `strikes` in a row its GPUs get no more work (the lanes shrink)."""
        self._strikes[worker] += 1
        if self._strikes[worker] >= self.settings.strikes and worker not in self.set_aside:
            self.set_aside[worker] = (
                f"{self._strikes[worker]} tasks in a row raised, the last {type(error).__name__}: {error}"
            )
            self.slots.follow(self._usable(self._workers))
            self._changed.set()

    def status(self) -> ClusterStatus:
        """The workers, what each GPU is on, and the throughput: for the views."""
        minutes = max(1e-9, (time.monotonic() - self._since) / 60)
        workers = [
            WorkerStatus(
                address=addr,
                host=str(info.get("host", "")),
                gpus=gpus_of(info),
                running=list(self.running.get(addr, [])),
                evaluations=self.finished[addr],
                set_aside=self.set_aside.get(addr),
            )
            for addr, info in sorted(self._workers.items())
        ]
        return ClusterStatus(
            address=self.address, workers=workers, evaluations_per_minute=sum(self.finished.values()) / minutes
        )

    def workers(self) -> dict[str, dict[str, Any]]:
        """The scheduler's last word on its workers (address -> its identity), for the views."""
        return dict(self._workers)

    async def changed(self) -> None:
        """Wait until the workers or their GPUs change."""
        self._changed.clear()
        await self._changed.wait()

    async def wait_for_gpus(self) -> int:
        """The number of GPUs once there is at least one; ClusterUnavailable after `wait_s` without any."""
        await self.client()
        try:
            async with asyncio.timeout(self.settings.wait_s):
                while self.gpus() == 0:
                    await self.changed()
        except TimeoutError:
            raise ClusterUnavailable(
                f"no worker of the Dask cluster at {self.address} offers a GPU after {self.settings.wait_s:g} s: "
                f"start one per GPU with `{worker_command(self.address)}`"
            ) from None
        return self.gpus()

    async def nvcc_version(self) -> str:
        """The nvcc version of the cluster's builders (asked of one worker once): part of every cache key."""
        if self._version is None:
            client = await self.client()
            found = await client.submit(nvcc_here, pure=False)
            if found is None:
                raise ClusterUnavailable(
                    f"the Dask worker that was asked has no working nvcc ({self.address}): builds run on any worker, "
                    "so every worker needs the CUDA toolkit (or set KERNELFORGE_BUILD__NVCC there)"
                )
            self._version = str(found)
        return self._version

    async def on_a_gpu(
        self, doing: str, prefer: str | None, task: Callable[..., T], *args: Any, avoid: str | None = None
    ) -> tuple[T, str]:
        """`task(*args)` on a worker with a free GPU (`prefer`'s when it is free, another than `avoid`'s when one is),
        shown as `doing` while it runs there; its result and the worker. Dask runs it elsewhere if that worker dies; a
        task that raised there is WorkerFault (a strike against the worker)."""
        from distributed.client import FutureCancelledError

        client = await self.client()
        async with self.slots.slot(prefer, avoid) as worker:
            self.running[worker].append(doing)
            future = client.submit(  # not pure: the same candidate timed again is a new measurement, not a cached one
                task, *args, resources={GPU: 1}, workers=[worker], allow_other_workers=True, pure=False
            )
            try:
                result: T = await future
            except FutureCancelledError:
                raise
            except Exception as exc:
                self._struck(worker, exc)
                raise WorkerFault(worker, exc) from exc
            finally:
                future.release()
                self.running[worker].remove(doing)
            self._strikes.pop(worker, None)
            return result, worker

    async def first_gpu_arch(self) -> str | None:
        """The target of a GPU worker's first GPU (asked of one worker), None without a real GPU there."""
        client = await self.client()
        found: dict[str, str] = await client.submit(identify, pure=False, resources={GPU: 1})
        return found["arch"] or None

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._client is not None:
            await self._client.close()
            self._client = None


Slot = tuple[str, int]
"""A GPU of the cluster: its worker's address and that worker's generation (a worker that went and came back at
the same address is a new generation: the slots of the old one are void)."""


class GpuSlots:
    """The cluster's GPUs as slots (a worker's address, once per GPU it offers), handed out first come, first served,
    to the searches of this process. A search asks for the worker it used last (its card is loaded there), and gets
    it when it is free; a slot that comes back goes to a waiter that asked for its worker, else to the longest one."""

    def __init__(self) -> None:
        self._free: list[Slot] = []
        self._waiters: collections.deque[tuple[str | None, asyncio.Future[Slot]]] = collections.deque()
        self._offered: dict[str, int] = {}
        self._generation: dict[str, int] = {}

    def follow(self, workers: dict[str, dict[str, Any]]) -> None:
        """Add the slots of workers that came (or offer more GPUs), void those of workers that went."""
        offered = {addr: gpus_of(w) for addr, w in workers.items()}
        offered = {addr: count for addr, count in offered.items() if count}
        for addr in set(self._offered) - set(offered):
            self._generation[addr] = self._generation.get(addr, 0) + 1
        added = [
            (addr, self._generation.get(addr, 0))
            for addr, count in offered.items()
            for _ in range(count - self._offered.get(addr, 0))
        ]
        self._offered = offered
        self._free = [slot for slot in self._free if self._valid(slot)]
        for slot in added:
            self._hand_over(slot)

    def _valid(self, slot: Slot) -> bool:
        addr, generation = slot
        return addr in self._offered and self._generation.get(addr, 0) == generation

    def _hand_over(self, slot: Slot) -> None:
        """A free slot: to a waiter that asked for its worker, else to the longest waiter, else to the free list."""
        live = [w for w in self._waiters if not w[1].done()]
        chosen = next((w for w in live if w[0] == slot[0]), live[0] if live else None)
        self._waiters = collections.deque(live)
        if chosen is None:
            self._free.append(slot)
            return
        self._waiters.remove(chosen)
        chosen[1].set_result(slot)

    async def _acquire(self, prefer: str | None, avoid: str | None) -> Slot:
        if self._free and not any(not w[1].done() for w in self._waiters):
            other = next((s for s in self._free if s[0] != avoid), self._free[0])
            slot = next((s for s in self._free if s[0] == prefer), other)
            self._free.remove(slot)
            return slot
        waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append((prefer, waiter))
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._hand_over(waiter.result())  # handed over just as we were cancelled: pass it on
            raise

    @contextlib.asynccontextmanager
    async def slot(self, prefer: str | None = None, avoid: str | None = None) -> AsyncIterator[str]:
        """A free GPU's worker (`prefer`'s when it is free, another than `avoid`'s when one is), held for the block."""
        while not self._valid(slot := await self._acquire(prefer, avoid)):
            pass  # its worker went: the slot is dropped
        try:
            yield slot[0]
        finally:
            if self._valid(slot):
                self._hand_over(slot)


class ClusterBuilder(Builder):
    """Checks sources here and caches cubins here, as a local Builder does; nvcc runs on a cluster worker."""

    def __init__(self, cluster: Cluster, settings: Settings, arch: str) -> None:
        b = settings.build
        super().__init__(nvcc=None, arch=arch, max_parallel=b.max_parallel, **b.builder_options())
        self.cluster = cluster

    async def toolchain(self) -> tuple[str | None, str | None]:
        return f"nvcc on the cluster at {self.cluster.address}", await self.cluster.nvcc_version()

    def chain(self, version: str) -> Toolchain:
        """What a worker builds with (a build task) and keys its cache by (a GPU task): this builder's own."""
        return Toolchain(
            arch=self._arch or DEFAULT_ARCH,
            version=version,
            flags=list(self.flags),
            timeout_s=self.timeout_s,
            max_log_bytes=self.max_log_bytes,
            max_diagnostics=self.max_diagnostics,
            max_global_bytes=self.max_global_bytes,
        )

    async def compile(self, nvcc: str, source: str, arch: str, key: str) -> BuildResult:
        client = await self.cluster.client()
        chain = self.chain(await self.cluster.nvcc_version())
        try:
            result, cubin = await client.submit(compile_remote, chain, source, key, pure=False)
        except Exception as exc:  # the worker died or the task was lost: not the source's fault, not cached
            return build_failure(key, "sandbox", f"the cluster's build task failed: {type(exc).__name__}: {exc}")
        return self.adopt(BuildResult.model_validate_json(result), cubin)


def shipped(built: BuildResult) -> ShippedBuild:
    """A build as it travels to a worker: the result without this machine's path, and the cubin's bytes."""
    cubin = built.cubin_path.read_bytes() if built.cubin_path is not None else None
    return built.model_copy(update={"cubin_path": None}).model_dump_json(), cubin


class ClusterBackend:
    """A search's evaluation backend on a Dask cluster: as many GPU lanes as the cluster has GPUs, now."""

    def __init__(
        self,
        card: Card,
        settings: Settings,
        cluster: Cluster,
        *,
        simulation: Simulation | None = None,
        owns_cluster: bool = True,
        max_lanes: int | None = None,
    ) -> None:
        """`simulation`: workers simulate timings (the simulated backend's, on fake GPU resources) instead of
        measuring on their GPUs. `owns_cluster`: `close` closes the connection too (not when a bench shares it).
        `max_lanes`: evaluations at once at most (a bench runs one card per GPU: one each)."""
        self.card = card
        self.settings = settings
        self.cluster = cluster
        self.simulation = simulation
        self.owns_cluster = owns_cluster
        self.max_lanes = max_lanes
        self.ceilings: Ceilings | None = None
        """The first GPU's measured ceilings that came back with an evaluation (a bench's report uses them)."""
        self.name = SIMULATED if simulation is not None else "gpu"
        self.lanes = 1
        self.gpu_name = f"cluster {cluster.address}"
        self.builder: ClusterBuilder | None = None
        self._packed: CardPackage | None = None
        self._package: Any = None
        """The card's package on the cluster: a `distributed.Future` that every GPU task depends on."""
        self._sending = asyncio.Lock()
        self._last_worker: str | None = None
        """Where this search's last task ran: its card is loaded there, so the next one goes there when it can."""
        self._hosting: Hosting | None = None

    async def start(self) -> None:
        """Wait for a GPU worker, build the harness's helpers and the baseline, send the card to the cluster."""
        self.lanes = self._capped(await self.cluster.wait_for_gpus())
        arch = self.settings.build.arch
        if arch is None and self.simulation is None:
            arch = await self.cluster.first_gpu_arch()
        builder = ClusterBuilder(self.cluster, self.settings, arch or DEFAULT_ARCH)
        self.builder = builder
        builds = [await builder.build(helpers_source(), "kf_compare_float32")]
        baseline = self.card.spec.baseline
        if baseline is not None:
            builds.append(await builder.build(self.card.baseline_source(), baseline.plan.entry))
        for built in builds:
            if not built.ok:
                raise BaselineFailed(f"the card's baseline or the harness's helpers do not build: {build_error(built)}")
        version = await self.cluster.nvcc_version()
        kind = "simulated" if self.simulation is not None else "gpu"
        self._hosting = Hosting(
            kind=kind,
            settings=self.settings.model_dump_json(),
            toolchain=builder.chain(version),
            simulation=self.simulation or Simulation(),
        )
        self._packed = await asyncio.to_thread(pack_card, self.card, [shipped(b) for b in builds])
        await self._send_card()
        gpus = self.cluster.gpus()
        self.gpu_name = f"cluster {self.cluster.address} ({gpus} GPU{'s' * (gpus != 1)} at the start)"

    async def lanes_changed(self, lanes: int) -> int:
        """Wait until the cluster's GPU count is not `lanes` any more; the new count (at least 1: with none, the
        work waits here until a GPU worker comes)."""
        while self._capped(self.cluster.gpus()) == lanes:
            await self.cluster.changed()
        self.lanes = self._capped(self.cluster.gpus())
        return self.lanes

    def _capped(self, gpus: int) -> int:
        return max(1, min(gpus, self.max_lanes or gpus))

    async def build(self, source: str, plan: LaunchPlan) -> Evaluation | None:
        assert self.builder is not None, "start() first"
        return await prebuild(self.card, self.builder, source, plan)

    async def evaluate(self, source: str, plan: LaunchPlan) -> Evaluation:
        assert self.builder is not None, "start() first"
        prepared = await build_candidate(self.card, self.builder, source, plan)
        if isinstance(prepared, Evaluation):
            return prepared
        built, _ = prepared
        verdict = await self._on_a_gpu(evaluate_remote, shipped(built), source, plan.model_dump_json())
        assert verdict.evaluation is not None
        evaluation = Evaluation.model_validate_json(verdict.evaluation)
        self.cluster.finished[verdict.worker] += 1
        if verdict.ceilings is not None and self.ceilings is None:
            self.ceilings = Ceilings.model_validate_json(verdict.ceilings)
        return evaluation.model_copy(update={"build": built, "measured_on": verdict.measured_on})

    async def profile(self, source: str, plan: LaunchPlan, measured_us: float | None = None) -> NodeProfile:
        """ncu on a GPU worker (its GPU resource held, so no timing runs there meanwhile)."""
        assert self.builder is not None, "start() first"
        kernel = await build_for_profile(self.card, self.builder, source, plan)
        verdict = await self._on_a_gpu(
            profile_remote, shipped(kernel.build), source, plan.model_dump_json(), measured_us
        )
        if verdict.refusal is not None:
            refusal = verdict.refusal
            refused = _REFUSALS.get(refusal.kind, ProfileFailed)
            raise refused(f"{refusal.message} (on {verdict.measured_on})", refusal.fix)
        assert verdict.profile is not None
        return NodeProfile.model_validate_json(verdict.profile)

    async def _on_a_gpu(self, task: Callable[..., Verdict], *args: Any) -> Verdict:
        """Run a task on a worker with a free GPU (chosen here: Dask's scheduler counts a worker's resources, not
        which are in use, and would queue every task behind the worker that holds the card). Dask re-runs it
        elsewhere when its worker dies; a task lost with the card's data, or that raised on its worker, is sent again
        (`resubmits` times in all), and its result is taken once."""
        from distributed.client import FutureCancelledError

        node = EVALUATING.get()
        doing = self.card.spec.name + (f" #{node}" if node is not None else "")
        resubmits = self.settings.cluster.resubmits
        failed_on: str | None = None
        while True:
            package = self._package
            try:
                verdict, self._last_worker = await self.cluster.on_a_gpu(
                    doing, self._last_worker, task, package, self._hosting, *args, avoid=failed_on
                )
                return verdict
            except FutureCancelledError:
                if resubmits == 0:
                    raise
                resubmits -= 1
                await self._send_card(package)
            except WorkerFault as fault:
                if resubmits == 0:
                    raise
                resubmits -= 1
                failed_on = fault.worker  # elsewhere when another GPU is free
                self._last_worker = None

    async def _send_card(self, lost: Any = None) -> None:
        """Scatter the card's package to the cluster: at the start, and again when the workers that held it died
        (Dask cannot recompute scattered data; this process still has it). Once for all lanes that lost it."""
        async with self._sending:
            if lost is not None and self._package is not lost:
                return  # another lane sent it again already
            client = await self.cluster.client()
            self._package = await client.scatter(self._packed, hash=False)
            if lost is not None:
                lost.release()

    async def close(self) -> None:
        if self._package is not None:
            self._package.release()
        if self.owns_cluster:
            await self.cluster.close()


async def time_vendor(cluster: Cluster, card: Card, request: VendorRequest) -> VendorReply:
    """The card's vendor library timed on a free GPU of the cluster (the bench's column beside each search)."""
    package = await asyncio.to_thread(pack_card, card, [])
    doing = f"{card.spec.name} (vendor)"
    reply, _ = await cluster.on_a_gpu(doing, None, vendor_remote, package, request.model_dump_json())
    return VendorReply.model_validate_json(reply)
