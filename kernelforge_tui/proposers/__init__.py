"""Proposers: where candidate kernels come from (the offline template library, later LLM agents).

The search knows proposers only through `Proposer` (see `base.py`), so the two are interchangeable.
"""

from kernelforge_tui.proposers.base import FailedSibling, ParentInfo, Proposal, ProposalContext, Proposer

__all__ = ["FailedSibling", "ParentInfo", "Proposal", "ProposalContext", "Proposer"]
