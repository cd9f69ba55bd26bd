"""Template seeds built for sm_90 side by side: what a template test asserts of its bench kernels' builds."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import resolve
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.proposers.base import Proposal


def build_problems(builder: Builder, chosen: Sequence[tuple[OperatorCard, Proposal]]) -> list[str]:
    """Each (card, seed) built at once; per seed that failed to build, has no ptxas report for its entry or spills
    (stores or loads), a line naming it with the log's end or its ptxas statistics."""

    async def build_all() -> list[str]:
        built = await asyncio.gather(
            *(builder.build(p.source, p.plan.entry, resolve(p.plan, spec).args) for spec, p in chosen)
        )
        problems = []
        for (spec, proposal), result in zip(chosen, built, strict=True):
            stats = result.ptxas.get(proposal.plan.entry)
            if not result.ok or stats is None:
                problems.append(f"{spec.name} {proposal.params}: {result.log[-1500:]}")
            elif stats.spill_store_bytes or stats.spill_load_bytes:
                problems.append(f"{spec.name} {proposal.params}: spills {stats}")
        return problems

    return asyncio.run(build_all())
