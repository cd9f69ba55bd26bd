"""The asyncio side of evaluation: one worker subprocess per GPU, its watchdog and restarts.

`GpuWorker` speaks the JSON-lines protocol to one `kernelforge_tui.gpu.worker` process; a reply that
does not come in time means a hung kernel (the process group is killed), and a worker that dies means a
fault (it is restarted). Either way the caller gets a typed `EvalResult`, never an exception.
`Evaluator` adds what makes a speedup real on top: the card loaded with fresh seeds, the baseline built
and timed beside every candidate, and the measured ceilings that no honest kernel can beat.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import secrets
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ValidationError

from kernelforge_tui.atomic import write_atomic
from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.expr import ExprError
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cards.plan import ResolvedLaunch, resolve
from kernelforge_tui.config import Settings, cache_dir
from kernelforge_tui.errors import BaselineFailed, CheckFailed
from kernelforge_tui.gpu.detect import GpuInfo
from kernelforge_tui.gpu.ncu.hardware import roofline_floor
from kernelforge_tui.gpu.protocol import (
    CardLoaded,
    Evaluate,
    KernelRef,
    LoadCard,
    MeasureCeilings,
    ReplyEnvelope,
    RequestEnvelope,
    WorkerFailure,
)
from kernelforge_tui.gpu.subprocess_worker import kill_group, spawn_worker, tail_text
from kernelforge_tui.vocabulary.evaluation import BuildResult, Ceilings, EvalResult, Evaluation
from kernelforge_tui.vocabulary.nodes import FailureKind

STDERR_LINES = 40


class WorkerError(CheckFailed):
    """The GPU worker could not be set up or did not answer (exit code 1 where it ends a command)."""


class WorkerDied(WorkerError):
    """The worker exited without answering (a faulting kernel, or a broken installation)."""


class WorkerTimeout(WorkerError):
    """The worker did not answer in time and was killed (a hung kernel)."""


class GpuWorker:
    """One GPU worker subprocess, started on demand and restarted after it dies."""

    def __init__(self, gpu_index: int = 0, argv: Sequence[str] | None = None) -> None:
        """`argv` replaces the worker command (tests run stand-ins that hang, die or babble)."""
        self.gpu_index = gpu_index
        self.argv = list(argv or [sys.executable, "-m", "kernelforge_tui.gpu.worker"])
        self.process: asyncio.subprocess.Process | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.restarts = 0
        self._stderr_task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        self.process, self._stderr_task = await spawn_worker(
            self.argv, self.stderr_tail, self.gpu_index, env={"PYTHONUNBUFFERED": "1"}
        )

    async def request(self, message: RequestEnvelope, timeout_s: float) -> BaseModel:
        """Send one request and wait for its reply; WorkerTimeout or WorkerDied when none comes."""
        if not self.alive:
            if self.process is not None:
                self.restarts += 1
            await self.start()
        process = self.process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(message.model_dump_json().encode() + b"\n")
            await process.stdin.drain()
            async with asyncio.timeout(timeout_s):
                line = await process.stdout.readline()
        except TimeoutError:
            await self.kill()
            raise WorkerTimeout(f"no answer within {timeout_s:g} s: the worker was killed") from None
        except (BrokenPipeError, ConnectionResetError):
            line = b""
        if not line:
            await self.wait_exit()
            raise WorkerDied(self._death_note())
        try:
            return ReplyEnvelope.model_validate_json(line).reply
        except ValidationError as exc:
            await self.kill()
            raise WorkerDied(f"the worker answered garbage ({exc.errors()[0]['msg']}): {line[:200]!r}") from None

    def _death_note(self) -> str:
        code = self.process.returncode if self.process else None
        tail = tail_text(self.stderr_tail, 6)
        return f"the GPU worker exited (code {code}) while running the request" + (f": {tail}" if tail else "")

    async def wait_exit(self) -> None:
        if self.process is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await self.process.wait()
            if self._stderr_task is not None:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    async with asyncio.timeout(2):
                        await self._stderr_task

    async def kill(self) -> None:
        """Kill the whole process group (the worker and anything it started)."""
        if self.process is not None:
            kill_group(self.process)
        await self.wait_exit()

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                async with asyncio.timeout(10):
                    await self.process.wait()
            except TimeoutError:
                await self.kill()
        await self.wait_exit()


def ceilings_path(gpu_uuid: str) -> Path:
    """Where one GPU's measured ceilings are cached (v2: best of several copy launch shapes; v3: with the SM's
    shared memory, registers and threads)."""
    return cache_dir() / "ceilings" / f"v3-{gpu_uuid}.json"


def cached_ceilings(gpu_uuid: str) -> Ceilings | None:
    """The ceilings measured earlier on this GPU, or None (profiling and reports never measure them)."""
    try:
        return Ceilings.model_validate_json(ceilings_path(gpu_uuid).read_text())
    except (OSError, ValidationError, json.JSONDecodeError):
        return None


def helpers_source() -> str:
    return resources.files("kernelforge_tui.gpu").joinpath("helpers.cu").read_text()


class Evaluator:
    """Proves and times candidates for one card on one GPU, against the card's baseline."""

    def __init__(
        self, card: Card, builder: Builder, settings: Settings, gpu: GpuInfo, worker: GpuWorker | None = None
    ) -> None:
        """`worker` replaces the GPU worker process (tests run a stand-in that speaks the same protocol)."""
        self.card = card
        self.builder = builder
        self.settings = settings
        self.gpu = gpu
        self.worker = worker or GpuWorker(gpu.index)
        self.ceilings: Ceilings | None = None
        self.baseline: KernelRef | None = None
        self.helpers: Path | None = None
        self.loaded: CardLoaded | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Build the helper and baseline kernels, measure (or read) the ceilings, load the card."""
        helpers = await self.builder.build(helpers_source(), "kf_compare_float32")
        if not helpers.ok or helpers.cubin_path is None:
            raise WorkerError(f"the harness's own helper kernels did not build: {helpers.log[-2000:]}")
        self.helpers = helpers.cubin_path
        if self.card.spec.baseline is not None:
            built = await self.builder.build(self.card.baseline_source(), self.card.spec.baseline.plan.entry)
            if not built.ok or built.cubin_path is None:
                raise BaselineFailed(f"the card's baseline kernel does not build: {build_error(built)}")
            self.baseline = KernelRef(
                cubin=built.cubin_path, launch=resolve(self.card.spec.baseline.plan, self.card.spec)
            )
        self.ceilings = await self._ceilings()
        await self._load_card()

    async def _load_card(self) -> None:
        assert self.helpers is not None
        request = LoadCard(
            card_dir=self.card.root,
            helpers_cubin=self.helpers,
            settings=self.settings.eval,
            fresh_seed=secrets.randbelow(2**31),
            baseline=self.baseline,
        )
        reply = await self.worker.request(RequestEnvelope(request=request), timeout_s=900)
        if isinstance(reply, WorkerFailure):
            raise WorkerError(f"the GPU worker could not load card {self.card.spec.name}: {reply.error}")
        assert isinstance(reply, CardLoaded)
        self.loaded = reply

    async def _ceilings(self) -> Ceilings:
        """Measured once per GPU and cached: copy bandwidth and FMA rate."""
        known = cached_ceilings(self.gpu.uuid)
        if known is not None:
            return known
        path = ceilings_path(self.gpu.uuid)
        assert self.helpers is not None
        reply = await self.worker.request(
            RequestEnvelope(request=MeasureCeilings(helpers_cubin=self.helpers)), timeout_s=300
        )
        if not isinstance(reply, Ceilings):
            raise WorkerError(f"measuring the GPU's ceilings failed: {reply}")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, reply.model_dump_json(indent=2))
        return reply

    async def evaluate(self, source: str, plan: LaunchPlan, *, time_it: bool = True) -> Evaluation:
        """Build, prove and time one candidate. Every failure is a typed Evaluation, never an exception."""
        prepared = await build_candidate(self.card, self.builder, source, plan)
        if isinstance(prepared, Evaluation):
            return prepared
        built, launch = prepared
        assert built.cubin_path is not None
        request = Evaluate(
            candidate=KernelRef(cubin=built.cubin_path, launch=launch),
            baseline=self.baseline,
            time_it=time_it,
            bytes_moved=self.card.spec.bytes_moved(),
            flops=self.card.spec.flops(),
        )
        async with self._lock:
            result = await self._run(request)
        return self._judge(result, built)

    async def _run(self, request: Evaluate) -> EvalResult:
        if not self.worker.alive and self.loaded is not None:
            try:  # a fresh worker after a crash: reload the card first
                await self._load_card()
            except WorkerError as exc:
                await self.worker.kill()  # a worker without the card is useless: the next request starts afresh
                return EvalResult(ok=False, failure="worker", reason=f"the restarted GPU worker failed: {exc}")
        try:
            reply = await self.worker.request(RequestEnvelope(request=request), self.settings.eval.timeout_s)
        except WorkerTimeout as exc:
            return EvalResult(ok=False, failure="timeout", reason=f"the kernel did not finish: {exc}")
        except WorkerDied as exc:
            return EvalResult(ok=False, failure="launch", reason=str(exc))
        if isinstance(reply, WorkerFailure):
            return EvalResult(ok=False, failure="worker", reason=reply.error)
        assert isinstance(reply, EvalResult)
        if reply.fatal:
            await self.worker.wait_exit()
        return reply

    def _judge(self, result: EvalResult, built: BuildResult) -> Evaluation:
        """Hold the timed launches against the card's roofline floor: faster than physics means skipped work.

        The share shown is the median's; the refusal looks at the fastest tenth of the launches, so a kernel fast
        beyond physics on some launches only is refused too (honest launches scatter a few percent, not 10%)."""
        share = None
        spec = self.card.spec
        if result.ok and self.ceilings is not None and result.candidate is not None:
            floor = roofline_floor(spec.flops(), spec.bytes_moved(), self.ceilings, [t.dtype for t in spec.inputs])
            if floor.seconds > 0:
                floor_us = floor.seconds * 1e6
                share = floor_us / result.candidate.median_us
                fastest = floor_us / result.candidate.p10_us
                margin = self.settings.eval.ceiling_margin
                if fastest > margin:
                    result.ok, result.failure = False, FailureKind.CHEAT
                    result.reason = (
                        f"impossible: a tenth of its timed launches took {result.candidate.p10_us:.3g} us or less, "
                        f"under the roofline floor of {floor_us:.3g} us ({floor.limit}): {fastest:.0%} of the speed "
                        f"physics allows, limit {margin:.0%}; it must skip work the operator requires"
                    )
        return Evaluation(
            ok=result.ok,
            failure=result.failure,
            reason=result.reason,
            build=built,
            result=result,
            ceiling_share=share,
        )

    async def close(self) -> None:
        await self.worker.close()


async def build_candidate(
    card: Card, builder: Builder, source: str, plan: LaunchPlan
) -> tuple[BuildResult, ResolvedLaunch] | Evaluation:
    """Resolve the plan and build the source: (build, launch), or the failed Evaluation saying why."""
    try:
        launch = resolve(plan, card.spec)
    except ExprError as exc:
        return Evaluation(ok=False, failure="launch", reason=f"bad launch plan: {exc}")
    built = await builder.build(source, plan.entry, launch.args)
    if not built.ok or built.cubin_path is None:
        return Evaluation(ok=False, failure="compile", reason=build_error(built), build=built)
    return built, launch


def build_error(built: BuildResult) -> str:
    """The first compiler error, placed, for a failure's reason line."""
    errors = [d for d in built.diagnostics if d.severity == "error"]
    if errors:
        first = errors[0]
        where = f"line {first.line}: " if first.line else ""
        return f"{built.failure or 'build failed'}: {where}{first.message}"
    return f"{built.failure or 'build failed'}: {built.log.strip()[-300:]}"
