"""A node's reward with every term, so each score the tree backs up can be explained in words."""

from __future__ import annotations

from pydantic import BaseModel


class RewardTerm(BaseModel):
    """One term of a reward: its name, its value, and the numbers behind it in words."""

    name: str
    value: float
    explanation: str


class Reward(BaseModel):
    """A node's reward: the terms, their total, and one line comparing it with its parent."""

    total: float
    terms: list[RewardTerm]
    explanation: str

    def term(self, name: str) -> RewardTerm | None:
        return next((t for t in self.terms if t.name == name), None)
