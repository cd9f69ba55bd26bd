"""What runs on a cluster's workers: nvcc builds anywhere, evaluations and profiles where a GPU is.

These functions are Dask tasks, but they need nothing of Dask (only its worker's address, to say who measured):
they take and return plain data (JSON text and bytes). A GPU worker process hosts, per card, the very evaluation
path of a local search (an `Evaluator` with its long-lived GPU worker subprocess, or the simulation): the same
checks and the same timing, each candidate timed against the card's baseline on the same GPU. Hosting is kept
across tasks on a thread of its own with its own event loop, so a card is loaded once per worker, not once per
candidate, and the Dask worker's own event loop (its heartbeats) never waits on a GPU.

No worker compiles what it evaluates: the coordinator ships each cubin with its candidate (and the helper and
baseline cubins with the card), and the worker's builder only finds them in its cache. So every GPU lane runs
exactly the bytes the coordinator cached, whichever worker built them (builds are tasks for any worker).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import io
import os
import socket
import tarfile
import tempfile
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from kernelforge_tui.build.nvcc import Builder, build_failure
from kernelforge_tui.cards.directory import Card, load_card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.config import BuilderOptions, Settings
from kernelforge_tui.engine.backend import SimulatedBackend
from kernelforge_tui.engine.vendor_timer import VendorTimer
from kernelforge_tui.errors import KernelForgeError
from kernelforge_tui.gpu.detect import detect_gpus, gpu_label
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.gpu.ncu.run import ProfileError
from kernelforge_tui.gpu.ncu.service import ProfilingService, build_for_profile
from kernelforge_tui.suite.vendor_timing import VendorReply, VendorRequest
from kernelforge_tui.vocabulary.evaluation import BuildResult, Evaluation
from kernelforge_tui.vocabulary.profiles import NodeProfile

T = TypeVar("T")

HOSTED_CARDS = 2
"""Cards a GPU worker keeps loaded at once (a bench spreads several searches); the least recently used goes."""


class Toolchain(BaseModel):
    """What the coordinator's cache keys are made of: a worker's builder must make the same keys. The `[build]`
    caps are among them, and a build task on a worker holds nvcc's output and the globals to the coordinator's."""

    arch: str
    version: str
    flags: list[str]
    timeout_s: float
    max_log_bytes: int
    max_diagnostics: int
    max_global_bytes: int

    def options(self) -> BuilderOptions:
        return BuilderOptions(
            flags=self.flags,
            timeout_s=self.timeout_s,
            max_log_bytes=self.max_log_bytes,
            max_diagnostics=self.max_diagnostics,
            max_global_bytes=self.max_global_bytes,
        )

    def builder(self, cache_dir: Path) -> Builder:
        """A build task's builder: this worker's nvcc, the coordinator's flags, timeout and caps."""
        return Builder(arch=self.arch, cache_dir=cache_dir, **self.options())


class Simulation(BaseModel):
    """The simulated backend's parameters (CI's fake GPUs): the same numbers on every worker as in one process.
    A field left None is the backend's own default (`SimulatedBackend`'s, not a copy of it here)."""

    seed: int | None = None
    baseline_us: float | None = None
    noise: float | None = None
    failure_rate: float | None = None
    eval_seconds: float | None = None
    max_speedup: float | None = None


class Hosting(BaseModel):
    """How a worker hosts a card: the coordinator's settings and toolchain, and real GPU or simulation."""

    kind: Literal["gpu", "simulated"]
    settings: str
    """`Settings` as JSON (the evaluation and profile sections matter here)."""
    toolchain: Toolchain
    simulation: Simulation = Simulation()


ShippedBuild = tuple[str, bytes | None]
"""A build the coordinator made (`BuildResult` as JSON) and its cubin: a worker's cache takes it as it is."""


class ProfileRefusal(BaseModel):
    """A profile that did not come (no ncu there, say): the `ProfileError` subclass by name, to raise it again."""

    kind: str
    message: str
    fix: str = ""


class Verdict(BaseModel):
    """A worker's answer: the evaluation (or profile), and who measured it."""

    evaluation: str | None = None
    profile: str | None = None
    refusal: ProfileRefusal | None = None
    measured_on: str
    worker: str
    """The Dask worker's address."""
    ceilings: str | None = None
    """The GPU's measured ceilings (`Ceilings` as JSON), None when simulated: a bench's report needs them."""
    """`host GPU-index name` (or `host simulated`): which GPU measured it."""


class CardPackage(BaseModel):
    """A card directory as one tar archive, named by its content hash, with the builds a worker needs to start
    (the harness's helpers, the baseline): sent to a worker once, unpacked once."""

    digest: str
    data: bytes
    builds: list[ShippedBuild]


def pack_card(card: Card, builds: list[ShippedBuild]) -> CardPackage:
    """The card's directory as a tar archive in memory (its references travel with it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(card.root, arcname="card")
    data = buffer.getvalue()
    return CardPackage(digest=hashlib.sha256(data).hexdigest(), data=data, builds=builds)


class ShippedBuilder(Builder):
    """A worker's builder: the coordinator's toolchain in its keys, and no nvcc of its own (everything it evaluates
    was shipped; a build it is asked for and does not have fails without being cached)."""

    def __init__(self, toolchain: Toolchain, cache_dir: Path) -> None:
        super().__init__(nvcc=None, arch=toolchain.arch, cache_dir=cache_dir, **toolchain.options())
        self.version = toolchain.version

    async def toolchain(self) -> tuple[str | None, str | None]:
        return "nvcc (on the coordinator)", self.version

    async def compile(self, nvcc: str, source: str, arch: str, key: str) -> BuildResult:
        why = "this cluster worker compiles nothing and the coordinator shipped no cubin"
        return build_failure(key, "sandbox", why)


class HostedCard:
    """One card on one worker: unpacked once, its evaluation backend started once."""

    def __init__(self, package: CardPackage, hosting: Hosting, root: Path, worker: str) -> None:
        self.card = load_card(root / "card")
        self.settings = Settings.model_validate_json(hosting.settings)
        self.builder = ShippedBuilder(hosting.toolchain, root / "cubins")
        self.shipped: set[str] = set()
        self.ship(package.builds)
        self.hosting = hosting
        self.backend: Evaluator | SimulatedBackend | None = None
        self.worker = worker
        self.measured_on = ""

    def ship(self, builds: list[ShippedBuild]) -> None:
        """Put the coordinator's builds in this card's cache (each once: a candidate's comes with every task)."""
        for result, cubin in builds:
            if result not in self.shipped:
                self.builder.remember(BuildResult.model_validate_json(result), cubin)
                self.shipped.add(result)

    async def started(self) -> Evaluator | SimulatedBackend:
        if self.backend is None:
            if self.hosting.kind == "simulated":
                sim = self.hosting.simulation
                backend: Evaluator | SimulatedBackend = SimulatedBackend(
                    self.card, self.builder, **sim.model_dump(exclude_none=True)
                )
                where = f"{socket.gethostname()} simulated"
            else:
                gpus = detect_gpus()
                if not gpus:
                    raise KernelForgeError(
                        f"cluster worker {self.worker} offers the GPU resource but sees no GPU "
                        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
                    )
                backend = Evaluator(self.card, self.builder, self.settings, gpus[0])
                where = gpu_label(gpus[0])
            self.measured_on = f"{where} (worker {self.worker})" if self.worker else where
            await backend.start()
            self.backend = backend
        return self.backend

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()


class WorkerHost:
    """A worker process's cards, served on one event loop in a thread of its own."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        """The Dask worker's address (said with each measurement), empty outside a worker."""
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="kernelforge-host", daemon=True).start()
        self.cards: collections.OrderedDict[str, HostedCard] = collections.OrderedDict()
        self.root = Path(tempfile.mkdtemp(prefix="kernelforge-worker-"))
        self.lock = asyncio.Lock()
        self.vendor: VendorTimer | None = None
        """The vendor library's timing process on this worker's GPU (made at the first vendor task)."""

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the host's loop and wait for it (called from a Dask task's thread)."""
        done: Future[T] = asyncio.run_coroutine_threadsafe(work, self.loop)
        return done.result()

    def unpacked(self, package: CardPackage) -> Path:
        """Where the package's card directory is on this worker (`root/card`), unpacked at its first task."""
        root = self.root / package.digest[:16]
        if not (root / "card").is_dir():
            scratch = Path(tempfile.mkdtemp(dir=self.root))
            with tarfile.open(fileobj=io.BytesIO(package.data)) as archive:
                archive.extractall(scratch, filter="data")
            scratch.rename(root)
        return root

    async def card(self, package: CardPackage, hosting: Hosting, build: ShippedBuild | None) -> HostedCard:
        """The card hosted and started, with `build` (the candidate's) in its cache."""
        key = hashlib.sha256(package.digest.encode() + hosting.model_dump_json().encode()).hexdigest()[:16]
        async with self.lock:
            hosted = self.cards.get(key)
            if hosted is None:
                root = await asyncio.to_thread(self.unpacked, package)
                hosted = HostedCard(package, hosting, root, self.worker)
                self.cards[key] = hosted
                while len(self.cards) > HOSTED_CARDS:
                    _, oldest = self.cards.popitem(last=False)
                    await oldest.close()
            self.cards.move_to_end(key)
            if build is not None:
                hosted.ship([build])
            await hosted.started()
            return hosted


_host: WorkerHost | None = None
_host_lock = threading.Lock()


def host() -> WorkerHost:
    """This process's host (made at its first task)."""
    global _host
    with _host_lock:
        if _host is None:
            _host = WorkerHost(_worker_address())
        return _host


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return ""


def compile_remote(toolchain: Toolchain, source: str, key: str) -> tuple[str, bytes | None]:
    """A build task: nvcc on this worker, into a scratch cache; the result as JSON and the cubin's bytes."""
    with tempfile.TemporaryDirectory(prefix="kernelforge-remote-build-") as scratch:
        builder = toolchain.builder(cache_dir=Path(scratch))
        result = asyncio.run(_compile_checked(builder, toolchain, source, key))
        cubin = result.cubin_path.read_bytes() if result.ok and result.cubin_path is not None else None
        return result.model_copy(update={"cubin_path": None}).model_dump_json(), cubin


async def _compile_checked(builder: Builder, toolchain: Toolchain, source: str, key: str) -> BuildResult:
    nvcc, version = await builder.toolchain()
    where = socket.gethostname()
    if nvcc is None or version is None:
        why = f"no working nvcc on cluster worker {where}: install the CUDA toolkit there"
        return build_failure(key, "sandbox", why)
    if version != toolchain.version:
        return build_failure(
            key, "sandbox", f"cluster worker {where} has nvcc {version}, the run builds with {toolchain.version}"
        )
    return await builder.compile(nvcc, source, toolchain.arch, key)


def evaluate_remote(package: CardPackage, hosting: Hosting, build: ShippedBuild, source: str, plan: str) -> Verdict:
    """An evaluation task (on a worker with the GPU resource): prove and time one candidate there."""
    return host().run(_evaluate(package, hosting, build, source, LaunchPlan.model_validate_json(plan)))


async def _evaluate(
    package: CardPackage, hosting: Hosting, build: ShippedBuild, source: str, plan: LaunchPlan
) -> Verdict:
    hosted = await host().card(package, hosting, build)
    backend = await hosted.started()
    evaluation: Evaluation = await backend.evaluate(source, plan)
    ceilings = backend.ceilings.model_dump_json() if isinstance(backend, Evaluator) and backend.ceilings else None
    return Verdict(
        evaluation=evaluation.model_dump_json(),
        measured_on=hosted.measured_on,
        worker=hosted.worker,
        ceilings=ceilings,
    )


def profile_remote(
    package: CardPackage, hosting: Hosting, build: ShippedBuild, source: str, plan: str, measured_us: float | None
) -> Verdict:
    """A profile task (on a worker with the GPU resource): ncu on one launch of a candidate there."""
    return host().run(_profile(package, hosting, build, source, LaunchPlan.model_validate_json(plan), measured_us))


async def _profile(
    package: CardPackage,
    hosting: Hosting,
    build: ShippedBuild,
    source: str,
    plan: LaunchPlan,
    measured_us: float | None,
) -> Verdict:
    hosted = await host().card(package, hosting, build)
    backend = await hosted.started()
    try:
        if isinstance(backend, SimulatedBackend):
            profile: NodeProfile = await backend.profile(source, plan, measured_us)
        else:
            kernel = await build_for_profile(hosted.card, hosted.builder, source, plan)
            service = ProfilingService(hosted.card, hosted.settings.profile, backend.gpu, backend.ceilings)
            profile = await service.profile(kernel, measured_us)
    except ProfileError as exc:
        refusal = ProfileRefusal(kind=type(exc).__name__, message=exc.message, fix=exc.fix)
        return Verdict(refusal=refusal, measured_on=hosted.measured_on, worker=hosted.worker)
    return Verdict(profile=profile.model_dump_json(), measured_on=hosted.measured_on, worker=hosted.worker)


def vendor_remote(package: CardPackage, request: str) -> str:
    """A vendor timing task (on a worker with the GPU resource): the card's vendor library timed on that GPU by the
    worker's own timing process (pinned as the worker is, by its CUDA_VISIBLE_DEVICES); the reply as JSON."""
    return host().run(_vendor(package, VendorRequest.model_validate_json(request))).model_dump_json()


async def _vendor(package: CardPackage, request: VendorRequest) -> VendorReply:
    here = host()
    root = await asyncio.to_thread(here.unpacked, package)
    here.vendor = here.vendor or VendorTimer()
    return await here.vendor.time(request.model_copy(update={"card_dir": root / "card"}))


def nvcc_here() -> str | None:
    """The version of this worker's nvcc (None without a working one): the cluster's builds are keyed by it."""
    return asyncio.run(Builder().toolchain())[1]


def identify() -> dict[str, str]:
    """Who a worker is (for the views): its host and the GPUs it sees (none for a CPU-only or simulated worker)."""
    gpus = detect_gpus()
    return {
        "host": socket.gethostname(),
        "gpus": ", ".join(f"{g.index} {g.name}" for g in gpus),
        "arch": gpus[0].arch if gpus else "",
    }
