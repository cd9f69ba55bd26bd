"""What the team's other roles answer, read strictly: the analyst's diagnosis, the planner's strategy, the judge's
verdict. (A kernel reply is read by `replies.parse_kernel`.)

Why strict: an answer is used as it stands (a strategy's first line becomes the node's mutation text, a score a
term of the reward), so one that does not have the agreed form is refused, the call recorded as malformed, rather
than guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernelforge_tui.llm.client import Malformed
from kernelforge_tui.proposers.replies import JSON_TAGS, fenced_blocks
from kernelforge_tui.proposers.sections import first_line

TITLE_CHARS = 80
"""A mutation text's length at most (the search tree shows it on one line)."""


@dataclass(frozen=True)
class Strategy:
    """The planner's answer: a one-line title (the node's mutation text) and the plan the coder follows."""

    title: str
    text: str
    calls: tuple[int, ...] = ()


class Verdict(BaseModel):
    """The judge's answer, exactly this JSON object."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    score: float = Field(ge=0, le=1, allow_inf_nan=False)
    critique: str = Field(min_length=1)


def parse_text(text: str) -> str:
    """Any text but none (the analyst's diagnosis)."""
    if not text.strip():
        raise Malformed("the reply is empty")
    return text.strip()


def parse_strategy(text: str) -> Strategy:
    """A title on the first line (markdown heading or bold marks and a "Title:" label dropped), then the plan."""
    body = parse_text(text)
    title = body.splitlines()[0].strip("#*- \t").removeprefix("Title:").strip("* \t")
    if not title:
        raise Malformed("the first line is not a title; start with a one-line title naming the change")
    return Strategy(first_line(title, TITLE_CHARS), body)


def parse_verdict(text: str) -> Verdict:
    """The reply as one JSON object, bare or in one ```json block; Malformed saying what is wrong."""
    blocks = fenced_blocks(text)
    if len(blocks) > 1 or (blocks and blocks[0][0] not in JSON_TAGS | {""}):
        raise Malformed('answer with one JSON object only: {"score": <0..1>, "critique": "<one line>"}')
    body = blocks[0][1] if blocks else text
    try:
        verdict = Verdict.model_validate_json(body.strip(), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the reply"
        raise Malformed(f"the verdict is not valid: {where}: {first['msg']}") from None
    return verdict.model_copy(update={"critique": " ".join(verdict.critique.split())})
