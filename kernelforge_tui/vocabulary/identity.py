"""A candidate's identity: what makes two candidates of a run the same one, never evaluated twice.

Why not the source text: a template candidate is its template's parameters, and its text is a render of them. Keyed
by text, every render had to stay byte-identical forever, or a resumed run would take an old kernel for a new one
(and the other way round). So a template candidate is (template, template version, canonical parameters), and a
render change is a new template version (the golden render test refuses a changed render under an unchanged
version). A candidate nothing parameterises (an LLM's, a hand-written one, the card's baseline) is its normalised
source and its launch plan. The key hashes the identity with the card, since a render also depends on the card's
sizes and names.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard

ParamValue = int | str | float
"""A template parameter's value (block size, vector width, a variant's name)."""


class TemplateIdentity(BaseModel):
    """A template candidate: the template, the version of its renders, and its canonical parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["template"] = "template"
    template: str
    version: int = Field(ge=1)
    params: dict[str, ParamValue]


class SourceIdentity(BaseModel):
    """A candidate nothing parameterises: the sha256 of its normalised source and its plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["source"] = "source"
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")


Identity = Annotated[TemplateIdentity | SourceIdentity, Field(discriminator="kind")]


def normalised(source: str) -> str:
    """The source as its identity reads it: line ends as \\n, no trailing blanks on a line, no blank lines before
    or after (what an editor or a copy changes and nvcc does not see)."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def source_identity(source: str, plan: LaunchPlan) -> SourceIdentity:
    text = normalised(source) + "\0" + plan.model_dump_json()
    return SourceIdentity(digest=hashlib.sha256(text.encode(errors="backslashreplace")).hexdigest())


def canonical_json(identity: TemplateIdentity | SourceIdentity) -> str:
    """The identity's one serialisation: keys sorted, no spaces (so dict order and formatting never matter)."""
    return json.dumps(identity.model_dump(), sort_keys=True, separators=(",", ":"))


def candidate_key(identity: TemplateIdentity | SourceIdentity, card: OperatorCard) -> str:
    """The sha256 hex key of the identity on the card: equal keys are the same candidate."""
    text = canonical_json(identity) + "\0" + card.model_dump_json()
    return hashlib.sha256(text.encode(errors="backslashreplace")).hexdigest()
