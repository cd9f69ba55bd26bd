"""What a chat call sends and gets back, the same for every provider and wire protocol.

Why typed: the proposers, the store and the TUI read one shape whichever provider answered; tokens come from the
provider's own usage fields, so costs computed from them add up exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TRUNCATED = frozenset({"length", "max_tokens"})
"""Finish reasons (OpenAI's and Anthropic's) that mean the reply hit `max_tokens` and was cut off."""
REFUSALS = frozenset({"content_filter", "refusal"})
"""Finish reasons (OpenAI's and Anthropic's) that mean the model, or the provider's filter, refused the request."""


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
    """Tokens of a call. `input_tokens` counts every prompt token, the cached ones included; the cache counts say
    how many of those the provider wrote to or read from its prompt cache (they are priced apart). `estimated`:
    some of it was not reported by the provider but estimated (`llm.pricing.estimated_usage`)."""

    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    estimated: bool = False

    def plus(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            estimated=self.estimated or other.estimated,
        )


@dataclass
class Spend:
    """What one call used, attempt by attempt: the provider adds each attempt's usage as the attempt ends (what the
    server reported, or an estimate where it reported none), so whoever records the call reads it however the call
    ended: a reply, an error, a cancel. An attempt the server refused (an HTTP error status) used nothing."""

    attempts: list[Usage] = field(default_factory=list)

    def total(self) -> Usage | None:
        """The call's usage over its attempts; None when no attempt used anything."""
        return reduce(Usage.plus, self.attempts) if self.attempts else None


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
    """The end of the reply: the provider's terminal event, or a stream that closed after its final usage and finish
    reason. `usage` is the attempt's, None when the server reported none."""

    kind: Literal["end"] = "end"
    usage: Usage | None
    finish_reason: str | None


StreamEvent = TextDelta | Retrying | StreamEnd


class ChatReply(Frozen):
    """A whole reply. Times and usage count from the call, retries included; `first_token_s` is the first text of
    the attempt that succeeded (None if the reply has no text)."""

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

    @property
    def refused(self) -> bool:
        """The model or the provider's content filter refused: no reply to parse, and asking again will not help."""
        return self.finish_reason in REFUSALS
