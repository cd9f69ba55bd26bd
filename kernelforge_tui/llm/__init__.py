"""The LLM provider layer: chat calls over httpx to OpenAI-compatible and Anthropic APIs, streamed, no vendor SDK."""

from kernelforge_tui.llm.errors import LlmError, LlmErrorKind
from kernelforge_tui.llm.provider import Provider
from kernelforge_tui.llm.settings import ProviderSettings, Retries, Timeouts
from kernelforge_tui.llm.types import (
    ChatMessage,
    ChatReply,
    ChatRequest,
    Retrying,
    StreamEnd,
    StreamEvent,
    TextDelta,
    Usage,
)

__all__ = [
    "ChatMessage",
    "ChatReply",
    "ChatRequest",
    "LlmError",
    "LlmErrorKind",
    "Provider",
    "ProviderSettings",
    "Retries",
    "Retrying",
    "StreamEnd",
    "StreamEvent",
    "TextDelta",
    "Timeouts",
    "Usage",
]
