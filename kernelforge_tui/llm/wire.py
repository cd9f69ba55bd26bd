"""The two wire protocols: the request each one wants and the server-sent events each one streams back.

Why separate from the call: retries, timeouts and concurrency are the same for both; only the body, the headers
and the meaning of the events differ (OpenAI chat completions; Anthropic messages).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import AsyncIterator
from typing import Any, Protocol

from kernelforge_tui.llm.types import ChatRequest, StreamEnd, TextDelta, Usage

ANTHROPIC_VERSION = "2023-06-01"
LINE_END = re.compile(r"\r\n|\r|\n")
"""How server-sent events end a line."""


class WireError(Exception):
    """The stream broke the protocol or reported an error; `retryable` when the provider says it may pass."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class Parser(Protocol):
    def feed(self, event: str | None, data: str) -> TextDelta | StreamEnd | None:
        """One server-sent event in; the text it adds, the end of the reply, or nothing."""
        ...


class Wire(Protocol):
    def url(self, base_url: str) -> str: ...

    def headers(self, key: str | None) -> dict[str, str]: ...

    def body(self, request: ChatRequest) -> dict[str, Any]: ...

    def parser(self) -> Parser: ...


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a UTF-8 byte stream, as server-sent events split them. Each chunk is scanned once, so that a
    line sent in many chunks costs no more than its length (the caller bounds the bytes)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    partial: list[str] = []
    after_cr = False
    async for chunk in chunks:
        text = decoder.decode(chunk)
        if not text:
            continue
        if after_cr and text[0] == "\n":
            text = text[1:]  # the second half of a CRLF split between two chunks
        after_cr = text.endswith("\r")
        *complete, last = LINE_END.split(text)
        if complete:
            complete[0] = "".join(partial) + complete[0]
            partial = []
            for line in complete:
                yield line
        partial.append(last)
    partial.append(decoder.decode(b"", final=True))
    if line := "".join(partial):
        yield line


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, str]]:
    """(event name, data) per server-sent event; comments and events without data are skipped."""
    event: str | None = None
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
    if data:
        yield event, "\n".join(data)


def _json(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except json.JSONDecodeError as exc:
        raise WireError(f"the stream sent an event that is not JSON: {data[:80]!r}", retryable=False) from exc
    if not isinstance(value, dict):
        raise WireError(f"the stream sent an event that is not a JSON object: {data[:80]!r}", retryable=False)
    return value


def _error_text(payload: dict[str, Any]) -> str:
    error = payload.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or error)
    return str(error)


class OpenAiParser:
    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.finish_reason: str | None = None

    def feed(self, event: str | None, data: str) -> TextDelta | StreamEnd | None:
        if data.strip() == "[DONE]":
            return StreamEnd(usage=self.usage, finish_reason=self.finish_reason)
        chunk = _json(data)
        if "error" in chunk:
            raise WireError(f"the stream reported an error: {_error_text(chunk)}", retryable=True)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage(
                input_tokens=usage.get("prompt_tokens", 0), output_tokens=usage.get("completion_tokens", 0)
            )
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        text = (choice.get("delta") or {}).get("content")
        return TextDelta(text=text) if text else None


class OpenAiWire:
    """OpenAI-compatible chat completions: OpenAI, DeepSeek, OpenRouter, vLLM, SGLang, llama.cpp, Ollama."""

    def url(self, base_url: str) -> str:
        return f"{base_url}/chat/completions"

    def headers(self, key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def body(self, request: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            **request.extra,
            "model": request.model,
            "messages": [m.model_dump() for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        # OpenAI's reasoning models take only max_completion_tokens; local servers know only max_tokens.
        if "max_completion_tokens" not in request.extra:
            body["max_tokens"] = request.max_tokens
        return body

    def parser(self) -> Parser:
        return OpenAiParser()


class AnthropicParser:
    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0
        self.stop_reason: str | None = None

    def feed(self, event: str | None, data: str) -> TextDelta | StreamEnd | None:
        payload = _json(data)
        kind = payload.get("type", event)
        if kind == "message_start":
            usage = payload.get("message", {}).get("usage", {})
            self.input_tokens = usage.get("input_tokens", 0)
            self.output_tokens = usage.get("output_tokens", 0)
        elif kind == "content_block_delta":
            delta = payload.get("delta", {})
            if delta.get("type") == "text_delta" and delta.get("text"):
                return TextDelta(text=delta["text"])
        elif kind == "message_delta":
            # output_tokens here is the running total, not an increment.
            self.output_tokens = payload.get("usage", {}).get("output_tokens", self.output_tokens)
            self.stop_reason = payload.get("delta", {}).get("stop_reason") or self.stop_reason
        elif kind == "message_stop":
            usage = Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens)
            return StreamEnd(usage=usage, finish_reason=self.stop_reason)
        elif kind == "error":
            error_type = (payload.get("error") or {}).get("type")
            retryable = error_type in {"overloaded_error", "api_error", "rate_limit_error"}
            raise WireError(f"the stream reported an error: {_error_text(payload)}", retryable=retryable)
        return None


class AnthropicWire:
    """Anthropic messages; system messages go to the top-level `system` field, as the API wants."""

    def url(self, base_url: str) -> str:
        return f"{base_url}/v1/messages"

    def headers(self, key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if key:
            headers["x-api-key"] = key
        return headers

    def body(self, request: ChatRequest) -> dict[str, Any]:
        system = "\n\n".join(m.content for m in request.messages if m.role == "system")
        body: dict[str, Any] = {
            **request.extra,
            "model": request.model,
            "messages": [m.model_dump() for m in request.messages if m.role != "system"],
            "max_tokens": request.max_tokens,
            "stream": True,
        }
        if system:
            body["system"] = system
        return body

    def parser(self) -> Parser:
        return AnthropicParser()


WIRES: dict[str, Wire] = {"openai": OpenAiWire(), "anthropic": AnthropicWire()}
