"""The profiling service: a candidate's source in, a classified `NodeProfile` out, on one GPU.

Why one service per GPU lane, kept for the life of a search or a command: its `Profiler` holds the lane's
lock and the cached `ncu --version`, which a Profiler built per profile would lose each time; and the
search (`GpuBackend.profile`) and `kernelforge profile` go through the same steps (build from the cubin
cache, ncu on one launch, classification against that GPU's ceilings), so they cannot drift apart.

Building is separate from profiling (`build_for_profile`): it needs no GPU, so the search builds before it
takes a GPU lane and holds the lane only while ncu runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cards.plan import ResolvedLaunch
from kernelforge_tui.config import ProfileSettings
from kernelforge_tui.gpu.detect import GpuInfo
from kernelforge_tui.gpu.evaluate import build_candidate, cached_ceilings
from kernelforge_tui.gpu.ncu.hardware import analyse
from kernelforge_tui.gpu.ncu.run import ProfileFailed, Profiler
from kernelforge_tui.vocabulary.evaluation import BuildResult, Ceilings, Evaluation
from kernelforge_tui.vocabulary.profiles import NodeProfile


@dataclass(frozen=True)
class BuiltKernel:
    """A candidate ready to profile: its build (for the ptxas statistics), cubin and resolved launch."""

    build: BuildResult
    cubin: Path
    launch: ResolvedLaunch


async def build_for_profile(card: Card, builder: Builder, source: str, plan: LaunchPlan) -> BuiltKernel:
    """Build a candidate (a cache hit for anything already evaluated); ProfileFailed when it cannot be built."""
    prepared = await build_candidate(card, builder, source, plan)
    if isinstance(prepared, Evaluation):
        raise ProfileFailed(
            f"the candidate cannot be profiled: {prepared.reason}",
            "fix it first: `kernelforge eval` shows the compiler's messages",
        )
    built, launch = prepared
    assert built.cubin_path is not None
    return BuiltKernel(build=built, cubin=built.cubin_path, launch=launch)


class ProfilingService:
    """Profiles one card's candidates with ncu on one GPU and classifies them against its ceilings."""

    def __init__(self, card: Card, settings: ProfileSettings, gpu: GpuInfo, ceilings: Ceilings | None) -> None:
        """`ceilings`: the GPU's measured copy and FMA ceilings (the roofline is left out without them)."""
        self.card = card
        self.settings = settings
        self.gpu = gpu
        self.ceilings = ceilings
        self.profiler = Profiler(settings, gpu_index=gpu.index)

    @classmethod
    def for_gpu(cls, card: Card, settings: ProfileSettings, gpu: GpuInfo) -> ProfilingService:
        """A service with the ceilings measured earlier on this GPU, if any (profiling never measures them)."""
        return cls(card, settings, gpu, cached_ceilings(gpu.uuid))

    async def profile(self, kernel: BuiltKernel, measured_us: float | None = None) -> NodeProfile:
        """ncu on one launch, classified; `measured_us` (the worker's median) places it on the roofline."""
        report = await self.profiler.profile(self.card.root.resolve(), kernel.cubin, kernel.launch)
        spec = self.card.spec
        hardware = analyse(
            report,
            flops=spec.flops(),
            counted_bytes=spec.bytes_moved(),
            measured_us=measured_us,
            ceilings=self.ceilings,
            settings=self.settings.classifier,
            dtypes=[t.dtype for t in spec.inputs],
        )
        return NodeProfile(profile=report, hardware=hardware, ptxas=kernel.build.ptxas.get(kernel.launch.entry))
