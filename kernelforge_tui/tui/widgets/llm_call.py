"""One LLM call, readable: who asked which model what, what it cost, and the messages and reply, wrapped.

A call in flight shows the last lines of its reply so far, in a fixed height: redrawn a few times a second while it
streams, it never changes the layout (a new layout repaints the whole screen) and costs the same however long the
reply grows (the diff's place streams it whole). A call whose texts were not kept (the user keeps only their
hashes) shows the hashes in their place.
"""

from __future__ import annotations

import json
from typing import ClassVar

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from kernelforge_tui.engine.view import LiveCall, money_text, token_notes
from kernelforge_tui.vocabulary.llm import LlmCall

LIVE_LINES = 16
"""The lines of a reply in flight that the conversation shows: its tail."""
WAITING = "waiting for the first token"
ELSEWHERE = "written by a search in another process: the reply shows when the call ends"


def prompt_messages(prompt: str) -> list[tuple[str, str]]:
    """The prompt's (role, content) messages; a prompt that is not the JSON list of messages, as one message."""
    try:
        data = json.loads(prompt)
    except ValueError:
        return [("prompt", prompt)]
    if isinstance(data, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in data
    ):
        return [(m["role"], m["content"]) for m in data]
    return [("prompt", prompt)]


def relation(call: LlmCall | LiveCall) -> str:
    """Which nodes the call is about: the one it worked on, the one it wrote."""
    parts = []
    if call.node_id is not None:
        parts.append(f"worked on #{call.node_id}")
    if isinstance(call, LlmCall) and call.child_id is not None:
        parts.append(f"wrote #{call.child_id}")
    return " · ".join(parts)


class CallView(Widget):
    """An ended call (`LlmCall`) or one in flight (`LiveCall`, redrawn as its reply grows)."""

    DEFAULT_CSS = """
    CallView {
        width: 100%; height: auto; padding: 0 1; margin: 0 0 1 0;
        border-left: outer $primary 50%; background: $surface;
    }
    CallView.-live { border-left: outer $warning; }
    CallView.-failed { border-left: outer $error; }
    CallView:focus { background-tint: $foreground 5%; }
    CallView > .call-view--role { color: $secondary; text-style: bold; }
    CallView > .call-view--label { color: $text-muted; }
    CallView > .call-view--ok { color: $success; text-style: bold; }
    CallView > .call-view--failed { color: $error; text-style: bold; }
    CallView > .call-view--live { color: $warning; text-style: bold; }
    CallView > .call-view--rule { color: $primary 60%; }
    CallView > .call-view--missing { color: $text-muted; text-style: italic; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "call-view--role",
        "call-view--label",
        "call-view--ok",
        "call-view--failed",
        "call-view--live",
        "call-view--rule",
        "call-view--missing",
    }

    def __init__(self, call: LlmCall | LiveCall, *, streamed: bool = True, id: str | None = None) -> None:
        super().__init__(id=id, classes="-live" if isinstance(call, LiveCall) else "")
        self.call = call
        self.streamed = streamed
        """Whether a call in flight streams its text here (not in a run followed from another process)."""
        self._failed = isinstance(call, LlmCall) and call.outcome in ("error", "malformed", "refused")
        self.set_class(self._failed, "-failed")

    def show(self, call: LiveCall) -> None:
        """Redraw the call in flight, grown (its height does not change: no layout)."""
        self.call = call
        self.refresh()

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"call-view--{name}", partial=True)

    def _rule(self, title: str) -> Rule:
        return Rule(Text(f" {title} ", style=self._style("label")), align="left", style=self._style("rule"))

    def _body(self, text: str) -> Text:
        return Text(text, overflow="fold", no_wrap=False)

    def render(self) -> RenderableType:
        call = self.call
        label = self._style("label")
        head = Text.assemble((call.role, self._style("role")), (f"  {call.provider}/{call.model}  ", label))
        if isinstance(call, LiveCall):
            attempt = f" (attempt {call.attempt})" if call.attempt > 1 else ""
            head.append(f"writing…{attempt}", self._style("live"))
        else:
            head.append(call.outcome, self._style("failed" if self._failed else "ok"))
        where = relation(call)
        if where:
            head.append(f"  {where}", label)
        rows: list[RenderableType] = [head]
        if isinstance(call, LiveCall):
            rows.append(Text("the prompt and the figures show when the call ends", style=label))
            lines = call.text.split("\n") if call.pieces else []
            earlier = max(0, len(lines) - LIVE_LINES)
            rows.append(self._rule(f"reply so far (last {LIVE_LINES} lines)" if earlier else "reply so far"))
            if not lines:
                lines = ["", WAITING if self.streamed else ELSEWHERE]
            tail = [Text(line, no_wrap=True, overflow="ellipsis") for line in lines[earlier:]]
            tail += [Text("")] * (LIVE_LINES - len(tail))
            if not call.pieces:
                tail[1].stylize(self._style("missing"))
            rows.extend(tail)
            return Group(*rows)
        first = f" · first token {call.first_token_s:.2f} s" if call.first_token_s is not None else ""
        attempts = f" · {call.attempts} attempts" if call.attempts != 1 else " · 1 attempt"
        rows.append(
            Text.assemble(
                ("tokens ", label),
                f"{call.input_tokens:,} in / {call.output_tokens:,} out{token_notes(call)}",
                ("  cost ", label),
                money_text(call.cost_usd),
                ("  latency ", label),
                f"{call.latency_s:.2f} s{first}{attempts}",
            )
        )
        if call.error:
            rows.append(Text(f"error: {call.error}", style=self._style("failed"), overflow="fold"))
        if call.prompt is None:
            rows.append(self._rule("prompt"))
            rows.append(Text(f"not kept · sha256 {call.prompt_sha256}", style=self._style("missing"), overflow="fold"))
        else:
            for role, content in prompt_messages(call.prompt):
                rows.append(self._rule(role))
                rows.append(self._body(content))
        rows.append(self._rule("reply"))
        if call.reply is None:
            rows.append(Text(f"not kept · sha256 {call.reply_sha256}", style=self._style("missing"), overflow="fold"))
        elif call.reply:
            rows.append(self._body(call.reply))
        else:
            rows.append(Text("(no reply)", style=self._style("missing")))
        return Group(*rows)
