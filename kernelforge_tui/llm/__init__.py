"""The LLM provider layer: chat calls over httpx to OpenAI-compatible and Anthropic APIs, streamed, no vendor SDK."""

from kernelforge_tui.config import ProviderSettings, Retries, Timeouts
from kernelforge_tui.llm.client import Answer, CallSink, LlmClient, Malformed, NullSink
from kernelforge_tui.llm.errors import FatalLlmError, LlmError, LlmErrorKind
from kernelforge_tui.llm.provider import Provider
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
    "Answer",
    "CallSink",
    "ChatMessage",
    "ChatReply",
    "ChatRequest",
    "FatalLlmError",
    "LlmClient",
    "LlmError",
    "LlmErrorKind",
    "Malformed",
    "NullSink",
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
