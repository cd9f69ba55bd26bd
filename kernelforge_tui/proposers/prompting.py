"""Prompts: versioned text files under `prompts/`, filled in by name, and fitted into a token budget.

Why files: a prompt is behaviour a person reviews and changes on its own, and a change is a new version
(`planner.v2.md` beside `planner.v1.md`). The id of the file that asked travels at the top of the system message,
so a recorded call says which text produced its reply.

Why an estimate: the budget guards against prompts that grow with the tree (lineage, failures), not against a bill
(the bill comes from the provider's own token counts). No one tokenizer serves every provider, so tokens are
estimated at 4 characters each, the rule of thumb OpenAI and Anthropic give for English and code; it errs on the
generous side for code, which tokenizes at 3-4 characters a token.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from string import Template

from kernelforge_tui.llm.types import ChatMessage

CHARS_PER_TOKEN = 4
_NAME = re.compile(r"^(?P<role>[a-z_]+)\.v(?P<version>[0-9]+)\.md$")
_SECTION = re.compile(r"^## (system|user)[ \t]*$", re.M)


def estimate_tokens(text: str) -> int:
    """Tokens of `text`, estimated at CHARS_PER_TOKEN characters a token (rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def message_tokens(messages: Sequence[ChatMessage]) -> int:
    return sum(estimate_tokens(m.content) for m in messages)


@dataclass(frozen=True)
class Prompt:
    """One prompt file: `## system` and `## user` sections, or plain text (a fragment another prompt includes or a
    follow-up message). Placeholders are `$name`; a literal dollar is `$$`."""

    id: str
    """The file's name without `.md`, e.g. "planner.v1"."""
    system: Template | None
    user: Template

    @property
    def fields(self) -> set[str]:
        names = set(self.user.get_identifiers())
        return names | set(self.system.get_identifiers()) if self.system is not None else names

    def text(self, **fields: str) -> str:
        """The user section filled in (fragments and follow-ups)."""
        self._check(fields)
        return self.user.substitute(fields).strip()

    def messages(self, **fields: str) -> list[ChatMessage]:
        """A system message (headed by this prompt's id) and a user message, every placeholder filled."""
        if self.system is None:
            raise ValueError(f"prompt {self.id} has no ## system section")
        self._check(fields)
        system = f"[prompt {self.id}]\n" + self.system.substitute(fields).strip()
        return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=self.text(**fields))]

    def _check(self, fields: dict[str, str]) -> None:
        """Every placeholder filled and nothing given that the file does not use: a mismatch is a bug here."""
        if set(fields) != self.fields:
            missing, unused = sorted(self.fields - set(fields)), sorted(set(fields) - self.fields)
            raise ValueError(f"prompt {self.id}: missing fields {missing}, unused fields {unused}")


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("prompts", name).read_text(encoding="utf-8")


@functools.cache
def load(name: str) -> Prompt:
    """A prompt by role ("planner": its newest version) or by id ("planner.v1")."""
    if ".v" not in name:
        versions = [
            (int(m["version"]), f"{name}.v{m['version']}")
            for entry in resources.files(__package__).joinpath("prompts").iterdir()
            if (m := _NAME.match(entry.name)) and m["role"] == name
        ]
        if not versions:
            raise FileNotFoundError(f"no prompt file for {name!r} under proposers/prompts/")
        name = max(versions)[1]
    text = _read(f"{name}.md")
    parts = _SECTION.split(text)
    if len(parts) == 1:
        return Prompt(name, None, Template(text))
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    if set(sections) != {"system", "user"} or parts[0].strip():
        raise ValueError(f"prompt {name}: give a ## system and a ## user section and nothing before them")
    return Prompt(name, Template(sections["system"]), Template(sections["user"]))


# ---- fitting into the budget ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One item of a list section (an ancestor, a failed sibling) in full and summarised."""

    age: int
    """Smaller is older (a node id): the oldest entries are summarised first."""
    full: str
    short: str


@dataclass(frozen=True)
class Listing:
    """A list section of a prompt: its entries oldest first, and how it reads when empty or partly left out."""

    entries: Sequence[Entry]
    noun: str
    """What the entries are, in the plural ("earlier steps"), for the line that counts the ones left out."""
    empty: str
    foldable: bool = True
    """Entries may be left out (counted on one line) once every entry is summarised and the prompt still does not
    fit; False keeps every entry, summarised at worst (a debugger's one failure)."""

    def render(self, summarised: set[int], folded: int) -> str:
        if not self.entries:
            return self.empty
        lines = [f"({folded} {self.noun} left out to fit the prompt)"] if folded else []
        lines += [e.short if i in summarised else e.full for i, e in enumerate(self.entries) if i >= folded]
        return "\n".join(lines)


def fit(prompt: Prompt, budget: int, fields: dict[str, str], listings: dict[str, Listing]) -> list[ChatMessage]:
    """The prompt's messages within `budget` estimated tokens: while it does not fit, summarise the oldest entry
    of any listing still in full, then leave out the oldest entries of foldable listings. What cannot shrink (the
    card, the kernel) is sent whole even if over: better a long prompt than a kernel the model cannot see."""
    order = sorted((e.age, name, i) for name, listing in listings.items() for i, e in enumerate(listing.entries))
    summarised: dict[str, set[int]] = {name: set() for name in listings}
    folded = dict.fromkeys(listings, 0)

    def render() -> list[ChatMessage]:
        texts = {name: listing.render(summarised[name], folded[name]) for name, listing in listings.items()}
        return prompt.messages(**fields, **texts)

    steps: list[Callable[[], None]] = [functools.partial(summarised[name].add, i) for _, name, i in order]
    steps += [functools.partial(folded.__setitem__, name, i + 1) for _, name, i in order if listings[name].foldable]
    messages = render()
    for step in steps:
        if message_tokens(messages) <= budget:
            break
        step()
        messages = render()
    return messages
