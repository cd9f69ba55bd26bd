"""A proposer that never runs out: the toy seeds, then as many new kernels as asked, none faster than its parent.

Subtrees stall (and are pruned under strict tree settings) but a node always has more children, so a search with it
ends on its budget, never on an exhausted tree."""

from __future__ import annotations

from kernelforge_tui.proposers.base import Proposal, ProposalContext
from tests.engine.test_search import ToyProposer, toy_kernel


class Endless(ToyProposer):
    name = "endless"

    def __init__(self) -> None:
        super().__init__()
        self.made = 0

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        self.contexts.append(ctx)
        out = []
        for _ in range(n):
            self.made += 1
            kernel = toy_kernel(128, 1)
            source = kernel.source.replace("speedup=1.25", "speedup=1.0") + f"// variant {self.made}\n"
            out.append(kernel.model_copy(update={"source": source, "mutation": f"variant {self.made}", "params": {}}))
        return out
