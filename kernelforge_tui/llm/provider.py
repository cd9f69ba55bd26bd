"""A provider call: streamed over one shared `httpx.AsyncClient`, with retries, timeouts and a concurrency limit.

Why these rules:
- 429, 5xx, a dropped connection, a stream that ends before its terminal event and an idle stream (nothing within
  `idle_s`) may pass on a new attempt: retried with jittered exponential backoff, or after the server's
  `Retry-After` (seconds). An idle stream is treated as a dropped connection: the provider stalled, a new
  connection often does not.
- 400, 401, 403, 404 and other 4xx cannot pass by trying again (bad request, bad key, unknown model): raised at
  once, naming the fix. A 3xx is not followed (the request would be sent again, key included, to where the server
  says): the user fixes base_url.
- What a server sends is bounded: at most `limits.reply_bytes` of a response (a reply past it fails the call, not
  retried, since the next attempt would be as long) and `limits.error_bytes` of an error body. Every copy of the key
  in a reply, an error or a broken stream is masked where it enters (llm.masking).
- `total_s` bounds the whole call, waits between attempts included; when it is spent the call stops and is not
  retried, since a retry would have no time left.
- A slot of the provider's semaphore is held per attempt (not during the wait between attempts).
- Cancelling the task that awaits a call closes its HTTP stream at once (the response is closed in `finally`, and
  an unfinished response closes its connection rather than going back to the pool).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

import httpx

from kernelforge_tui.config import ProviderSettings
from kernelforge_tui.llm.errors import LlmError, LlmErrorKind
from kernelforge_tui.llm.masking import Masker
from kernelforge_tui.llm.pricing import estimated_usage
from kernelforge_tui.llm.types import ChatReply, ChatRequest, Retrying, Spend, StreamEnd, StreamEvent, TextDelta
from kernelforge_tui.llm.wire import WireError, sse_events, sse_lines, wire_for

T = TypeVar("T")

DETAIL_CHARS = 200
"""How much of a provider's own error text goes into a message: enough to say what is wrong."""


class Provider:
    """One configured provider. Several share one `httpx.AsyncClient`, which the caller opens and closes."""

    def __init__(self, settings: ProviderSettings, http: httpx.AsyncClient) -> None:
        self.settings = settings
        self._http = http
        self._wire = wire_for(settings)
        self._slots = asyncio.Semaphore(settings.max_concurrency)

    def __repr__(self) -> str:
        return f"Provider({self.settings.name!r}, {self.settings.protocol}, {self.settings.base_url})"

    def mask(self, text: str) -> str:
        """The text with every copy of this provider's key masked (what the client records of a call)."""
        return Masker(*self.settings.secrets())(text)

    async def chat(
        self, request: ChatRequest, on_text: Callable[[str, bool], None] | None = None, spend: Spend | None = None
    ) -> ChatReply:
        """The whole reply, with its latency, time to first token and usage over every attempt. `on_text(text,
        retry)` sees each piece as it arrives, and `("", True)` when an attempt failed and a new one starts (drop the
        text so far). `spend` gets each attempt's usage as it ends, also when the call fails or is cancelled."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        parts: list[str] = []
        first: float | None = None
        attempts = 1
        spend = spend if spend is not None else Spend()
        async with aclosing(self.stream_chat(request, spend)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    if first is None:
                        first = loop.time() - start
                    parts.append(event.text)
                    if on_text is not None:
                        on_text(event.text, False)
                elif isinstance(event, Retrying):
                    parts, first, attempts = [], None, event.attempt
                    if on_text is not None:
                        on_text("", True)
                else:
                    return ChatReply(
                        text="".join(parts),
                        usage=spend.total(),
                        finish_reason=event.finish_reason,
                        latency_s=loop.time() - start,
                        first_token_s=first,
                        attempts=attempts,
                    )
        raise AssertionError("stream_chat ends with a StreamEnd or raises")

    async def stream_chat(self, request: ChatRequest, spend: Spend | None = None) -> AsyncGenerator[StreamEvent, None]:
        """The reply as it is written: text deltas, a `Retrying` before each new attempt, then one `StreamEnd`.
        Iterate it inside `contextlib.aclosing` so that leaving early (a cancel, a break) closes the stream at once.
        `spend` gets each attempt's usage as the attempt ends (`Spend`)."""
        spend = spend if spend is not None else Spend()
        headers, secrets = self._headers()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.timeouts.total_s
        retries = self.settings.retries
        attempt = 1
        while True:
            try:
                async with self._slots, aclosing(self._attempt(request, headers, secrets, deadline, spend)) as events:
                    async for event in events:
                        yield event
                return
            except LlmError as err:
                if not err.retryable or attempt >= retries.max_attempts:
                    raise err.after(attempt) from err
                delay = err.retry_after_s if err.retry_after_s is not None else self._backoff(attempt)
                if loop.time() + delay >= deadline:
                    raise err.after(attempt) from err
                attempt += 1
                yield Retrying(attempt=attempt, delay_s=delay, reason=str(err))
                await asyncio.sleep(delay)

    def _headers(self) -> tuple[dict[str, str], tuple[str, ...]]:
        """The headers of this call's requests (the protocol's, the key's, the configured ones, those read from the
        environment, which win in that order) and the secrets among them, read now: a variable named and unset
        fails the call before anything is sent."""
        settings = self.settings
        key, secret = settings.api_key(), settings.secret_headers()
        unset = [(settings.api_key_env, "the provider's API key")] if settings.api_key_env and key is None else []
        unset += [(settings.headers_env[name], f"header {name}'s value") for name, v in secret.items() if v is None]
        if unset:
            env, what = unset[0]
            raise LlmError(settings.name, "no_key", f"${env} is not set", f"set {env} to {what}")
        headers = {**self._wire.headers(key), **settings.headers}
        headers.update({name: value for name, value in secret.items() if value is not None})
        return headers, tuple(settings.secrets())

    def _backoff(self, attempt: int) -> float:
        """Exponential in the attempt, capped, with the upper half jittered so that callers do not retry in step."""
        retries = self.settings.retries
        ceiling = min(retries.backoff_max_s, retries.backoff_s * 2.0 ** (attempt - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    async def _attempt(
        self, request: ChatRequest, headers: dict[str, str], secrets: tuple[str, ...], deadline: float, spend: Spend
    ) -> AsyncGenerator[StreamEvent, None]:
        """One request and its stream. Once the server took the request (200, a stream) the attempt is billed, so its
        usage goes to `spend` however it ends: as reported, or estimated where the server did not say."""
        timeouts = self.settings.timeouts
        http_request = self._http.build_request(
            "POST",
            self._wire.url(self.settings.base_url),
            json=self._wire.body(request),
            headers=headers,
            timeout=httpx.Timeout(connect=timeouts.connect_s, read=None, write=timeouts.idle_s, pool=None),
        )
        try:
            response = await self._within(self._http.send(http_request, stream=True), deadline, "the response")
        except httpx.TransportError as exc:
            raise self._dropped(f"the connection failed ({type(exc).__name__}: {exc})") from exc
        accepted = ended = False
        parser = self._wire.parser()
        received = 0
        try:
            if response.status_code != 200:
                body = await self._error_body(response, deadline)
                raise self._status_error(response, body, secrets, request.model)
            if "text/event-stream" not in response.headers.get("content-type", ""):
                raise self._error(
                    "protocol",
                    f"the reply is not a stream ({response.headers.get('content-type', 'no content type')})",
                    "point base_url at a server that streams server-sent events",
                )
            accepted = True
            masker = Masker(*secrets)
            end: StreamEnd | None = None
            async for event, data in sse_events(sse_lines(self._capped(self._chunks(response, deadline)))):
                try:
                    delta = parser.feed(event, data)
                except WireError as exc:
                    raise self._error(exc.kind, str(exc), self._fix(exc.kind, request.model)) from exc
                if isinstance(delta, TextDelta):
                    received += len(delta.text)
                    if text := masker.feed(delta.text):
                        yield TextDelta(text=text)
                elif isinstance(delta, StreamEnd):
                    end = delta
                    break
            # A stream that closed after its final usage and finish reason is whole: not retried, not paid twice.
            end = end or parser.ended()
            if end is None:
                raise self._dropped("the stream ended before its final event")
            if text := masker.flush():
                yield TextDelta(text=text)
            ended = True
            spend.attempts.append(end.usage if end.usage is not None else estimated_usage(request, None, received))
            yield end
        finally:
            if accepted and not ended:  # broken, stalled, refused mid-stream or cancelled: billed all the same
                spend.attempts.append(estimated_usage(request, parser.reported(), None))
            await response.aclose()

    async def _chunks(self, response: httpx.Response, deadline: float) -> AsyncGenerator[bytes, None]:
        """The body as it arrives, each wait bounded by the timeouts."""
        chunks = response.aiter_bytes()
        while True:
            try:
                chunk = await self._within(anext(chunks), deadline, "more of the reply")
            except StopAsyncIteration:
                return
            except httpx.TransportError as exc:
                raise self._dropped(f"the stream broke off ({type(exc).__name__}: {exc})") from exc
            yield chunk

    async def _capped(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The chunks up to `limits.reply_bytes`; one more byte fails the call."""
        cap = self.settings.limits.reply_bytes
        read = 0
        async for chunk in chunks:
            read += len(chunk)
            if read > cap:
                raise self._error(
                    "too_large",
                    f"the reply passed limits.reply_bytes ({cap} bytes) before it ended",
                    f"raise limits.reply_bytes of provider {self.settings.name} if its replies are this long,"
                    " or lower the model's max_tokens",
                )
            yield chunk

    async def _error_body(self, response: httpx.Response, deadline: float) -> bytes:
        """The first `limits.error_bytes` of an error response; the rest is never read (closing the response
        then closes its connection)."""
        limit = self.settings.limits.error_bytes
        body = bytearray()
        async with aclosing(self._chunks(response, deadline)) as chunks:
            async for chunk in chunks:
                body += chunk
                if len(body) >= limit:
                    break
        return bytes(body[:limit])

    async def _within(self, awaitable: Awaitable[T], deadline: float, what: str) -> T:
        """Await with the idle timeout, or what is left of the total one if that is shorter."""
        timeouts = self.settings.timeouts
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(min(timeouts.idle_s, remaining)):
                return await awaitable
        except TimeoutError:
            if remaining <= timeouts.idle_s:
                raise self._error(
                    "timeout",
                    f"the call took longer than its total timeout ({timeouts.total_s:g} s)",
                    "raise timeouts.total_s, or ask for fewer max_tokens",
                ) from None
            raise self._error(
                "idle",
                f"nothing came for {timeouts.idle_s:g} s while waiting for {what}",
                "raise timeouts.idle_s if the model thinks long before writing, or try again later",
            ) from None

    def _status_error(self, response: httpx.Response, body: bytes, secrets: tuple[str, ...], model: str) -> LlmError:
        status = response.status_code
        # Fed, not flushed: a body cut at the limit may end in the beginning of the key.
        detail = _detail(Masker(*secrets).feed(body.decode("utf-8", "replace")))
        said = f"HTTP {status}" + (f" ({detail})" if detail else "")
        if status == 429 or status >= 500:
            kind: LlmErrorKind = "rate_limited" if status == 429 else "server"
            retry_after_s = _retry_after(response.headers.get("retry-after"))
            return self._error(kind, said, self._fix(kind, model), status=status, retry_after_s=retry_after_s)
        if 300 <= status < 400:
            location = response.headers.get("location", "")[:DETAIL_CHARS]
            return self._error(
                "redirect",
                f"the server redirects the request ({said})" + (f" to {location}" if location else ""),
                f"set base_url ({self.settings.base_url}) to the address the API is served at",
                status=status,
            )
        if status in (401, 403):
            return self._error("auth", f"the key was refused: {said}", self._fix("auth", model), status=status)
        if status == 404:
            return self._error("not_found", f"not found: {said}", self._fix("not_found", model), status=status)
        return self._error(
            "bad_request", f"the request was refused: {said}", self._fix("bad_request", model), status=status
        )

    def _fix(self, kind: LlmErrorKind, model: str) -> str:
        """The fix for an error of this kind, the same whether an HTTP status or the stream reported it."""
        env = self.settings.api_key_env
        named = [env] if env else list(self.settings.headers_env.values())
        key = (
            f"check the key in {' and '.join(named)} (set {named[0]} to a valid key)"
            if named
            else "set api_key_env (or headers_env) to the key's variable"
        )
        fixes: dict[LlmErrorKind, str] = {
            "auth": key,
            "not_found": f"check the model name ({model}) and base_url ({self.settings.base_url})",
            "bad_request": "check the model's extra fields and max_tokens; a prompt too long for the model's context "
            "needs a lower llm.agents.prompt_tokens",
            "rate_limited": "wait and try again, or lower max_concurrency",
            "server": "try again later",
        }
        return fixes.get(kind, "try again later, or another provider")

    def _dropped(self, problem: str) -> LlmError:
        return self._error("dropped", problem, "check the network and base_url, or try again later")

    def _error(
        self,
        kind: LlmErrorKind,
        problem: str,
        fix: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> LlmError:
        """Every error this provider raises: its problem may quote the server, so the key is masked out of it."""
        return LlmError(self.settings.name, kind, self.mask(problem), fix, status=status, retry_after_s=retry_after_s)


def _detail(text: str) -> str:
    """The provider's own error message (both APIs put it in error.message), cut short."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:DETAIL_CHARS]
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or text.strip())[:DETAIL_CHARS]


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; anything else (the HTTP-date form, which these APIs do not use, nan, inf, a negative
    number, garbage) is taken as absent, so the backoff applies rather than no wait or a wait forever."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
