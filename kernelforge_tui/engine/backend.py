"""Evaluation backends: the GPU (one `Evaluator` per visible GPU) and a simulation for machines without one.

Why a simulation: CI has nvcc but no GPU, and the search, the store and the views must be tested for
real there. `SimulatedBackend` builds every candidate with the real nvcc (compile errors are real) and
then invents a deterministic latency from the source and the plan, as Kernel Tuner's simulation runner
replays measurements. It is named "simulated" wherever it shows (the run's backend, the GPU name, each
evaluation's reason): its numbers are never GPU measurements.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import hashlib
import math
import random
import re
from collections.abc import AsyncIterator
from typing import Generic, Protocol, TypeVar, runtime_checkable

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.config import Settings
from kernelforge_tui.errors import BadInput, BaselineFailed
from kernelforge_tui.gpu.detect import GpuInfo, gpu_label
from kernelforge_tui.gpu.evaluate import Evaluator, build_candidate
from kernelforge_tui.gpu.ncu.run import ProfilingUnavailable
from kernelforge_tui.gpu.ncu.service import ProfilingService, build_for_profile
from kernelforge_tui.gpu.statistics import robust_stats, speedup_interval
from kernelforge_tui.proposers.base import TargetGpu
from kernelforge_tui.vocabulary.evaluation import Ceilings, EvalResult, Evaluation, SetCheck, Timing
from kernelforge_tui.vocabulary.nodes import FailureKind
from kernelforge_tui.vocabulary.profiles import NodeProfile

EVALUATING: contextvars.ContextVar[int | None] = contextvars.ContextVar("evaluating", default=None)
"""The node a GPU lane is evaluating (set by the pipeline): a backend that shows where its work is (a cluster)
names it without every backend taking a node id it does not need."""
SIMULATED = "simulated"
SIMULATED_REPS = 20
"""Launches a simulated evaluation times each of candidate and baseline (a real one takes 20 or more)."""

T = TypeVar("T")


@runtime_checkable
class EvaluationBackend(Protocol):
    """Proves and times candidates for one card. `evaluate` never raises for a bad candidate."""

    gpu_name: str

    async def start(self) -> None: ...

    async def evaluate(self, source: str, plan: LaunchPlan) -> Evaluation: ...

    async def close(self) -> None: ...


@runtime_checkable
class PipelinedBackend(EvaluationBackend, Protocol):
    """A backend whose build stage the search can run ahead of the GPU (several nvcc at once).

    `build` fills the shared cubin cache, so the `evaluate` that follows finds the cubin and the GPU
    never waits on the compiler; `lanes` is how many evaluations may run at once (one per GPU).
    """

    name: str
    lanes: int

    async def build(self, source: str, plan: LaunchPlan) -> Evaluation | None:
        """None when the candidate built; else the failed Evaluation (compile or launch plan)."""
        ...


@runtime_checkable
class ElasticBackend(PipelinedBackend, Protocol):
    """A backend whose GPUs come and go (a cluster's workers): the pipeline keeps one lane per GPU there now."""

    async def lanes_changed(self, lanes: int) -> int:
        """Wait until the backend has a number of lanes other than `lanes`, and return it (at least 1)."""
        ...


@runtime_checkable
class ProfilingBackend(Protocol):
    """A backend that can profile a measured candidate with Nsight Compute (the search's profiling hook).

    `profile` raises a typed `ProfileError` (ncu missing, not permitted, timeout, unavailable) when no
    profile comes; the search then logs it and, for a missing or refused ncu, stops profiling on its own.
    On a GPU it holds the candidate's GPU lane, so ncu's replays never overlap a timing on that GPU.
    """

    async def profile(self, source: str, plan: LaunchPlan, measured_us: float | None = None) -> NodeProfile: ...


@runtime_checkable
class MeasuringBackend(Protocol):
    """A backend whose GPU worker measured the GPU (its ceilings and the SM's resources)."""

    @property
    def ceilings(self) -> Ceilings | None:
        """None until a worker has measured them."""
        ...


def target_gpu(backend: EvaluationBackend) -> TargetGpu:
    """The GPU as the proposers are told of it: measured, simulated, or not measured yet."""
    if isinstance(backend, PipelinedBackend) and backend.name == SIMULATED:  # a simulated cluster's too
        return TargetGpu(name=backend.gpu_name, simulated=True)
    ceilings = backend.ceilings if isinstance(backend, MeasuringBackend) else None
    return TargetGpu(name=backend.gpu_name, ceilings=ceilings)


def make_builder(settings: Settings, arch: str | None = None) -> Builder:
    """The one Builder a search shares between its build stage and its evaluators (one cubin cache)."""
    b = settings.build
    return Builder(nvcc=b.nvcc, arch=b.arch or arch, max_parallel=b.max_parallel, **b.builder_options())


async def prebuild(card: Card, builder: Builder, source: str, plan: LaunchPlan) -> Evaluation | None:
    """The build stage of the pipeline: a failed Evaluation, or None when the candidate is ready for the GPU."""
    prepared = await build_candidate(card, builder, source, plan)
    return prepared if isinstance(prepared, Evaluation) else None


class Lanes(Generic[T]):
    """GPU lanes handed out first come, first served.

    Why not an `asyncio.Queue`: a coroutine that calls `get()` while the queue holds an item takes it at
    once, ahead of a waiter that was woken but has not run yet; with evaluations queued back to back,
    the profiler waiting for a lane starved until the search ran out of candidates (seen on the H200).
    """

    def __init__(self) -> None:
        self._free: collections.deque[T] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[T]] = collections.deque()

    def release(self, lane: T) -> None:
        """Give a lane back: to the longest waiter, else to the free list."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(lane)
                return
        self._free.append(lane)

    async def acquire(self) -> T:
        if self._free and not self._waiters:
            return self._free.popleft()
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # handed over just as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    @contextlib.asynccontextmanager
    async def lane(self) -> AsyncIterator[T]:
        lane = await self.acquire()
        try:
            yield lane
        finally:
            self.release(lane)


class GpuBackend:
    """The real thing: one Evaluator (worker subprocess) per GPU, one evaluation at a time on each."""

    name = "gpu"

    def __init__(self, card: Card, settings: Settings, gpus: list[GpuInfo], builder: Builder | None = None) -> None:
        if not gpus:
            raise BadInput("GpuBackend needs at least one GPU (see kernelforge_tui.gpu.detect.require_gpu)")
        self.card = card
        self.settings = settings
        self.builder = builder or make_builder(settings, gpus[0].arch)
        self.evaluators = [Evaluator(card, self.builder, settings, gpu) for gpu in gpus]
        self.lanes = len(gpus)
        names = sorted({gpu.name for gpu in gpus})
        self.gpu_name = ", ".join(names) + (f" x{len(gpus)}" if len(gpus) > 1 else "")
        self._lanes: Lanes[Evaluator] = Lanes()
        self._profilers: dict[int, ProfilingService] = {}
        """One profiling service per GPU lane (by GPU index), made once the lane's ceilings are measured."""

    async def start(self) -> None:
        await asyncio.gather(*(e.start() for e in self.evaluators))
        for evaluator in self.evaluators:
            gpu = evaluator.gpu
            self._profilers[gpu.index] = ProfilingService(self.card, self.settings.profile, gpu, evaluator.ceilings)
            self._lanes.release(evaluator)

    @property
    def ceilings(self) -> Ceilings | None:
        """The first GPU's, as its worker measured them (each lane holds its candidates to its own)."""
        return self.evaluators[0].ceilings

    async def build(self, source: str, plan: LaunchPlan) -> Evaluation | None:
        return await prebuild(self.card, self.builder, source, plan)

    async def evaluate(self, source: str, plan: LaunchPlan) -> Evaluation:
        async with self._lanes.lane() as evaluator:
            evaluation = await evaluator.evaluate(source, plan)
        return evaluation.model_copy(update={"measured_on": gpu_label(evaluator.gpu)})

    async def profile(self, source: str, plan: LaunchPlan, measured_us: float | None = None) -> NodeProfile:
        """Profile one launch with ncu on a free GPU, holding its lane (no evaluation runs there meanwhile)."""
        kernel = await build_for_profile(self.card, self.builder, source, plan)  # the cache has the cubin
        async with self._lanes.lane() as evaluator:
            return await self._profilers[evaluator.gpu.index].profile(kernel, measured_us)

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self.evaluators), return_exceptions=True)


_DIRECTIVE = re.compile(r"//\s*kf-simulate:\s*(?P<key>speedup|fail)\s*=\s*(?P<value>[\w.]+)")
_DEFINE = re.compile(r"^\s*#define\s+(\w+)\s+(\S+)", re.MULTILINE)
_CONSTEXPR = re.compile(r"constexpr\s+\w+\s+(\w+)\s*=\s*([^;]+);")
_SIM_FAILURES = (FailureKind.MISMATCH, FailureKind.LAUNCH, FailureKind.TIMEOUT)


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts (sha256, not Python's salted hash)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class SimulatedBackend:
    """Real nvcc builds, invented timings: for CI and for trying the tool without a GPU.

    The simulated speedup is a product of factors, each fixed by one feature of the candidate: every
    `#define NAME VALUE` and `constexpr ... NAME = VALUE;` in the source, the block shape, and (weakly)
    the whole source text; so related candidates have related speedups and a search has something to
    find. Latency is the baseline's divided by it, with seeded noise. A comment `// kf-simulate:
    speedup=2.5` fixes the speedup and `// kf-simulate: fail=mismatch` fails the candidate (for tests);
    `failure_rate` fails that share of candidates (chosen by a hash of the source) as mismatch, launch or
    timeout. The card's baseline itself always measures about 1.0x.
    """

    name = SIMULATED

    def __init__(
        self,
        card: Card,
        builder: Builder,
        *,
        seed: int = 0,
        baseline_us: float = 100.0,
        noise: float = 0.01,
        failure_rate: float = 0.0,
        eval_seconds: float = 0.01,
        max_speedup: float = 8.0,
        lanes: int = 1,
    ) -> None:
        self.card = card
        self.builder = builder
        self.seed = seed
        self.baseline_us = baseline_us
        self.noise = noise
        self.failure_rate = failure_rate
        self.eval_seconds = eval_seconds
        """Simulated GPU time per evaluation: slept, and reported as the evaluation's GPU seconds."""
        self.max_speedup = max_speedup
        """The simulated ceiling: a candidate at this speedup is at 100% of it."""
        self.lanes = lanes
        self.gpu_name = "simulated (no GPU)"
        self.evaluations = 0
        self._slots = asyncio.Semaphore(lanes)
        self._baseline_source = ""
        self._draws: dict[str, int] = {}

    async def start(self) -> None:
        """Build the card's baseline for real: a card whose baseline does not compile is broken."""
        self._baseline_source = self.card.baseline_source()
        assert self.card.spec.baseline is not None
        failed = await self.build(self._baseline_source, self.card.spec.baseline.plan)
        if failed is not None:
            raise BaselineFailed(f"the card's baseline kernel does not build: {failed.reason}")

    async def build(self, source: str, plan: LaunchPlan) -> Evaluation | None:
        return await prebuild(self.card, self.builder, source, plan)

    def true_speedup(self, source: str, plan: LaunchPlan) -> float:
        """The noiseless simulated speedup of a candidate (1.0 for the baseline)."""
        if source == self._baseline_source:
            return 1.0
        for match in _DIRECTIVE.finditer(source):
            if match.group("key") == "speedup":
                with contextlib.suppress(ValueError):
                    return float(match.group("value"))
        features = [f"{k}={v}" for k, v in _DEFINE.findall(source)]
        features += [f"{k}={v.strip()}" for k, v in _CONSTEXPR.findall(source)]
        features.append(f"block={plan.block}")
        log_speedup = sum(math.log(0.6) + math.log(3.0) * _unit(self.seed, f) for f in features)
        log_speedup += 0.2 * (_unit(self.seed, source) - 0.5)
        return min(math.exp(log_speedup), self.max_speedup)

    def _failure(self, source: str) -> FailureKind | None:
        for match in _DIRECTIVE.finditer(source):
            if match.group("key") == "fail":
                value = match.group("value")
                return value if value in ("compile", "launch", "mismatch", "timeout", "cheat", "worker") else "mismatch"  # type: ignore[return-value]
        if source != self._baseline_source and _unit(self.seed, "fail", source) < self.failure_rate:
            return _SIM_FAILURES[int(_unit(self.seed, "kind", source) * len(_SIM_FAILURES))]
        return None

    async def evaluate(self, source: str, plan: LaunchPlan) -> Evaluation:
        prepared = await build_candidate(self.card, self.builder, source, plan)
        if isinstance(prepared, Evaluation):
            return prepared
        built, _ = prepared
        async with self._slots:
            await asyncio.sleep(self.eval_seconds)
            self.evaluations += 1
        gpu_s = self.eval_seconds
        failure = self._failure(source)
        if failure is not None:
            reason = f"simulated {failure} (no GPU ran this kernel)"
            result = EvalResult(ok=False, failure=failure, reason=reason, gpu_seconds=gpu_s)
            return Evaluation(ok=False, failure=failure, reason=reason, build=built, result=result)
        key = hashlib.sha256(source.encode()).hexdigest()
        draw = self._draws.get(key, 0)
        self._draws[key] = draw + 1
        rng = random.Random(f"{self.seed}:{key}:{draw}")
        speedup_true = self.true_speedup(source, plan)
        candidate = _timed(self.baseline_us / speedup_true, self.noise, rng)
        baseline = _timed(self.baseline_us, self.noise, rng)
        latency, base = candidate.median_us, baseline.median_us
        bytes_moved = self.card.spec.bytes_moved()
        result = EvalResult(
            ok=True,
            reason="simulated: no GPU ran this kernel",
            checks=[SetCheck(name="simulated", ok=True, reason="simulated: not compared on a GPU")],
            deterministic=True,
            candidate=candidate,
            baseline=baseline,
            speedup=base / latency,
            speedup_interval=speedup_interval(candidate, baseline),
            achieved_gbps=bytes_moved / (latency * 1e3) if bytes_moved else None,
            gpu_seconds=gpu_s,
        )
        share = min(1.0, (base / latency) / self.max_speedup)
        return Evaluation(ok=True, reason=result.reason, build=built, result=result, ceiling_share=share)

    async def profile(self, source: str, plan: LaunchPlan, measured_us: float | None = None) -> NodeProfile:
        """No GPU ran the kernel, so there is nothing to profile: no ncu numbers are made up."""
        raise ProfilingUnavailable(
            "the simulated backend runs no GPU, so candidates are not profiled (no ncu numbers are invented).",
            "run the search on a GPU (without --simulate) to profile candidates",
        )

    async def close(self) -> None:
        return None


def _timed(median_us: float, noise: float, rng: random.Random) -> Timing:
    """Seeded launch times around a true median, summarised as the worker summarises real ones."""
    return robust_stats([median_us * (1 + noise * rng.gauss(0, 1)) for _ in range(SIMULATED_REPS)])
