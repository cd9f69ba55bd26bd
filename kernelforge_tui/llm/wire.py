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

from kernelforge_tui.config import ProviderSettings
from kernelforge_tui.llm.errors import LlmErrorKind
from kernelforge_tui.llm.types import ChatRequest, StreamEnd, TextDelta, Usage

ANTHROPIC_VERSION = "2023-06-01"
LINE_END = re.compile(r"\r\n|\r|\n")
"""How server-sent events end a line."""


class WireError(Exception):
    """The stream broke the protocol or reported an error; `kind` says which, as for an HTTP status (an invalid
    request, a bad key or a context that is too long cannot pass by trying again; an overloaded server may)."""

    def __init__(self, message: str, *, kind: LlmErrorKind) -> None:
        super().__init__(message)
        self.kind: LlmErrorKind = kind


class Parser(Protocol):
    def feed(self, event: str | None, data: str) -> TextDelta | StreamEnd | None:
        """One server-sent event in; the text it adds, the end of the reply, or nothing."""
        ...

    def reported(self) -> Usage | None:
        """The usage the stream reported so far (Anthropic's input tokens come first; OpenAI's at the end), or
        None: what an attempt that ends early is counted by."""
        ...

    def ended(self) -> StreamEnd | None:
        """The end of the reply when the stream already carried its final usage and finish reason, though not its
        terminal event (a server that closes without `[DONE]` or `message_stop`); None while more is due."""
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
        raise WireError(f"the stream sent an event that is not JSON: {data[:80]!r}", kind="protocol") from exc
    if not isinstance(value, dict):
        raise WireError(f"the stream sent an event that is not a JSON object: {data[:80]!r}", kind="protocol")
    return value


def _count(value: object) -> int:
    """A token count as a server sent it; anything but a whole number of 0 or more (null, text) counts 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


ERROR_KINDS: dict[str, LlmErrorKind] = {
    "invalid_request_error": "bad_request",
    "context_length_exceeded": "bad_request",
    "string_above_max_length": "bad_request",
    "request_too_large": "bad_request",
    "billing_error": "bad_request",
    "not_found_error": "not_found",
    "model_not_found": "not_found",
    "authentication_error": "auth",
    "permission_error": "auth",
    "invalid_api_key": "auth",
    "rate_limit_error": "rate_limited",
    "rate_limit_exceeded": "rate_limited",
}
"""What an error reported inside a stream means, by its `code` or `type` (OpenAI's and Anthropic's names); any
other (overloaded_error, api_error, server_error, none) is the server's and may pass."""


def stream_error(payload: dict[str, Any]) -> WireError:
    """The error a stream reported, of the kind its code or type names."""
    error = payload.get("error")
    if not isinstance(error, dict):
        return WireError(f"the stream reported an error: {error}", kind="server")
    names = [n for n in (error.get("code"), error.get("type")) if isinstance(n, str)]
    kind = next((ERROR_KINDS[n] for n in names if n in ERROR_KINDS), None) or _status_kind(error.get("code"))
    text = str(error.get("message") or (names[0] if names else error))
    named = f" ({names[0]})" if names and names[0] != text else ""
    return WireError(f"the stream reported an error: {text}{named}", kind=kind)


def _status_kind(code: object) -> LlmErrorKind:
    """A numeric code is an HTTP status (vLLM sends one): a 4xx other than 408 and 429 is the request's fault."""
    if code == 429:
        return "rate_limited"
    if isinstance(code, int) and 400 <= code < 500 and code != 408:
        return "auth" if code in (401, 403) else "bad_request"
    return "server"


class OpenAiParser:
    def __init__(self, include_usage: bool = True) -> None:
        self.include_usage = include_usage
        """The request asked for usage (`stream_options`): the reply has not ended before it came."""
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.refused = False

    def feed(self, event: str | None, data: str) -> TextDelta | StreamEnd | None:
        if data.strip() == "[DONE]":
            return self._end()
        chunk = _json(data)
        if "error" in chunk:
            raise stream_error(chunk)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details")
            cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
            self.usage = Usage(
                input_tokens=_count(usage.get("prompt_tokens")),
                output_tokens=_count(usage.get("completion_tokens")),
                cache_read_tokens=cached or _count(usage.get("prompt_cache_hit_tokens")),  # DeepSeek's name
            )
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        delta = choice.get("delta") or {}
        if delta.get("refusal"):
            self.refused = True
            return TextDelta(text=delta["refusal"])
        text = delta.get("content")
        return TextDelta(text=text) if text else None

    def reported(self) -> Usage | None:
        return self.usage

    def ended(self) -> StreamEnd | None:
        if self.finish_reason is None or (self.include_usage and self.usage is None):
            return None
        return self._end()

    def _end(self) -> StreamEnd:
        """A reply given as a `refusal` instead of content ends as Anthropic's refusals do."""
        return StreamEnd(usage=self.usage, finish_reason="refusal" if self.refused else self.finish_reason)


class OpenAiWire:
    """OpenAI-compatible chat completions: OpenAI, DeepSeek, OpenRouter, vLLM, SGLang, llama.cpp, Ollama.
    `include_usage`: ask for the usage at the end of the stream (`stream_options`), which some servers reject."""

    def __init__(self, include_usage: bool = True) -> None:
        self.include_usage = include_usage

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
        }
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        # OpenAI's reasoning models take only max_completion_tokens; local servers know only max_tokens.
        if "max_completion_tokens" not in request.extra:
            body["max_tokens"] = request.max_tokens
        return body

    def parser(self) -> Parser:
        return OpenAiParser(self.include_usage)


class AnthropicParser:
    def __init__(self) -> None:
        self.usage: dict[str, int] = {}
        """Anthropic's usage fields as last reported: message_start's, then message_delta's running totals."""
        self.stop_reason: str | None = None

    def feed(self, event: str | None, data: str) -> TextDelta | StreamEnd | None:
        payload = _json(data)
        kind = payload.get("type", event)
        if kind == "message_start":
            self._update(payload.get("message", {}).get("usage"))
        elif kind == "content_block_delta":
            delta = payload.get("delta", {})
            if delta.get("type") == "text_delta" and delta.get("text"):
                return TextDelta(text=delta["text"])
        elif kind == "message_delta":
            self._update(payload.get("usage"))  # totals so far (output_tokens is not an increment)
            self.stop_reason = payload.get("delta", {}).get("stop_reason") or self.stop_reason
        elif kind == "message_stop":
            return StreamEnd(usage=self.reported(), finish_reason=self.stop_reason)
        elif kind == "error":
            raise stream_error(payload)
        return None

    def _update(self, usage: object) -> None:
        if isinstance(usage, dict):
            self.usage |= {k: _count(v) for k, v in usage.items() if isinstance(v, int)}

    def reported(self) -> Usage | None:
        if not self.usage:
            return None
        write = self.usage.get("cache_creation_input_tokens", 0)
        read = self.usage.get("cache_read_input_tokens", 0)
        return Usage(  # Anthropic's input_tokens are those after the last cache breakpoint: the cached ones add
            input_tokens=self.usage.get("input_tokens", 0) + write + read,
            output_tokens=self.usage.get("output_tokens", 0),
            cache_write_tokens=write,
            cache_read_tokens=read,
        )

    def ended(self) -> StreamEnd | None:
        """message_delta carries the stop reason with the final usage: the reply is whole without message_stop."""
        return StreamEnd(usage=self.reported(), finish_reason=self.stop_reason) if self.stop_reason else None


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


def wire_for(settings: ProviderSettings) -> Wire:
    """The wire protocol a provider speaks, with its request options."""
    if settings.protocol == "anthropic":
        return AnthropicWire()
    return OpenAiWire(include_usage=settings.stream_options)
