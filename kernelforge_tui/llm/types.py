"""What a chat call sends and gets back, the same for every provider and wire protocol.

Why typed: the proposers, the store and the TUI read one shape whichever provider answered; tokens come from the
provider's own usage fields, so costs computed from them add up exactly.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TRUNCATED = frozenset({"length", "max_tokens"})
"""Finish reasons (OpenAI's and Anthropic's) that mean the reply hit `max_tokens` and was cut off."""


class Frozen(BaseModel):
    """Values passed between tasks: frozen, and an unknown field is an error rather than silently dropped."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ChatMessage(Frozen):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(Frozen):
    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int = Field(gt=0)
    extra: dict[str, Any] = Field(default_factory=dict)
    """Per-model request fields sent as they are (temperature, reasoning effort, thinking budget); the fields this
    layer sets itself (model, messages, stream, max_tokens) win over them."""


class Usage(Frozen):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class TextDelta(Frozen):
    """A piece of the reply's text, as it arrives."""

    kind: Literal["text"] = "text"
    text: str


class Retrying(Frozen):
    """The attempt failed in a way that may pass; the next one starts after `delay_s`. Text streamed so far
    belongs to the failed attempt: a consumer drops it."""

    kind: Literal["retrying"] = "retrying"
    attempt: int
    delay_s: float
    reason: str


class StreamEnd(Frozen):
    """The provider's terminal event: the reply is complete. `usage` is None when the server reported none."""

    kind: Literal["end"] = "end"
    usage: Usage | None
    finish_reason: str | None


StreamEvent = TextDelta | Retrying | StreamEnd


class ChatReply(Frozen):
    """A whole reply. Times count from the call, retries included; `first_token_s` is the first text of the
    attempt that succeeded (None if the reply has no text)."""

    text: str
    usage: Usage | None
    finish_reason: str | None
    latency_s: float
    first_token_s: float | None
    attempts: int

    @property
    def truncated(self) -> bool:
        """The reply stopped at `max_tokens` rather than where the model meant to stop."""
        return self.finish_reason in TRUNCATED
