"""What a proposer says back: how it read a person's hint, and why it has nothing at all for a card.

Why optional protocols read here: the `Proposer` protocol is all a search needs to run, so a proposer of one's own
(`--proposer module:Class`) keeps working without these. The built-in ones answer them, and the search puts the
answers where the person looks: a log line for each hint applied ("templates read block=512"; "the agents keep it
as written for the planner's prompt"), and the run's reason when the proposer cannot serve the card ("no template
for family matmul"), instead of a run that ends after the baseline without a word. A proposer made of others (the
hybrid: templates and agents) answers with each of its parts.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.proposers.base import Proposer

NOTHING_TO_PROPOSE = "nothing to propose"
"""How the reason of a run whose proposer cannot serve its card begins (the views pick it out to say so plainly)."""


@runtime_checkable
class HintReader(Protocol):
    """A proposer that says what it made of a hint."""

    name: str

    def read_hint(self, card: OperatorCard, text: str) -> str:
        """What the proposer will do with `text` for this card, in words for the log (never empty)."""
        ...


@runtime_checkable
class CardChecker(Protocol):
    """A proposer that can tell, before it is asked, that it has nothing for a card."""

    name: str

    def cannot_serve(self, card: OperatorCard) -> str | None:
        """Why it can propose nothing for the card, with what to do instead (read after "the NAME proposer"),
        or None."""
        ...


def _parts(proposer: object) -> list[object]:
    """The proposers a composite proposer is made of (the hybrid's templates and agents), in their order."""
    return [value for value in getattr(proposer, "__dict__", {}).values() if isinstance(value, Proposer)]


def hint_feedback(proposer: object, card: OperatorCard, text: str) -> str:
    """What the run's proposer made of a hint: its own words, each part's for a composite, or a plain note for a
    proposer that says nothing about hints."""
    if isinstance(proposer, HintReader):
        return proposer.read_hint(card, text)
    parts = [part for part in _parts(proposer) if isinstance(part, HintReader)]
    if parts:
        return "; ".join(f"{part.name}: {part.read_hint(card, text)}" for part in parts)
    name = getattr(proposer, "name", type(proposer).__name__)
    return f"handed to the {name} proposer as written (it says nothing about what it understood)"


def cannot_serve(proposer: object, card: OperatorCard) -> str | None:
    """Why the run's proposer can offer nothing for the card, or None. A composite has nothing only when every
    part says so (one part fills in for another)."""
    if isinstance(proposer, CardChecker):
        return proposer.cannot_serve(card)
    parts = _parts(proposer)
    checkers = [part for part in parts if isinstance(part, CardChecker)]
    if not parts or len(checkers) < len(parts):
        return None
    said: list[str] = []
    for part in checkers:
        reason = part.cannot_serve(card)
        if reason is None:
            return None
        said.append(f"the {part.name} proposer {reason}")
    return f"has nothing for this card: {'; '.join(said)}"
