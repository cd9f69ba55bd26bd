"""Templates and agents side by side: the template library's seeds, then about half of every expansion's children
from each, so that the tree search, not a rule, finds out which of the two pays off on this card.

Why both: the templates are free and fast but run out of ideas within minutes; the agents are slow and cost money
but go where no template reaches, starting from the templates' best kernels as well as from their own. When one
has nothing for a node (no template for the family, a neighbourhood exhausted, a provider down), the other fills
in its share.
"""

from __future__ import annotations

from kernelforge_tui.cards.directory import Card
from kernelforge_tui.proposers.agents import LOST, AgentProposer
from kernelforge_tui.proposers.base import Proposal, ProposalContext, Proposer


class HybridProposer:
    """Template seeds; each expansion split between `templates` and `agents` (the agents' pooled first kernels when
    the root is first expanded)."""

    name = "hybrid"

    def __init__(self, templates: Proposer, agents: AgentProposer) -> None:
        self.templates = templates
        self.agents = agents
        self._turn = 0
        """Which side takes the odd child of an odd-sized expansion: they alternate."""

    def seeds(self, card: Card) -> list[Proposal]:
        return self.templates.seeds(card)

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        if n <= 0:
            return []
        templated = await self.templates.propose(ctx, n)
        if ctx.first_expansion:
            share = min(self.agents.settings.agents.pool_size, n)
        else:
            share = (n + self._turn) // 2
            self._turn ^= n % 2
        wanted = max(share, n - len(templated))
        try:
            written = await self.agents.propose(ctx, wanted) if wanted else []
        except LOST:
            if not templated:
                raise
            written = []
        return written + templated[: n - len(written)]
