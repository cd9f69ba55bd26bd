"""The provider layer against a real HTTP server on loopback that speaks both protocols and replays scripted
replies: streaming, usage, retries, timeouts, errors, keys, cancellation and the concurrency limit run for real."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import httpx
import pytest

from kernelforge_tui.errors import KernelForgeError
from kernelforge_tui.llm import (
    ChatMessage,
    ChatReply,
    ChatRequest,
    LlmError,
    Provider,
    ProviderSettings,
    Retrying,
    StreamEnd,
    TextDelta,
    Usage,
)
from tests.support.fakes.llm_server import LlmServer, Reply

SECRET = "sk-test-0123456789abcdef"
KEY_ENV = "KF_TEST_LLM_KEY"
REQUEST = ChatRequest(
    model="kernel-coder-1",
    messages=(ChatMessage(role="system", content="Write CUDA."), ChatMessage(role="user", content="softmax")),
    max_tokens=64,
    extra={"temperature": 0.2},
)

protocols = pytest.mark.parametrize("protocol", ["openai", "anthropic"])


@pytest.fixture
def server() -> Iterator[LlmServer]:
    with LlmServer() as running:
        yield running


def settings(server: LlmServer, protocol: str, **overrides: Any) -> ProviderSettings:
    data: dict[str, Any] = {
        "name": f"fake-{protocol}",
        "protocol": protocol,
        "base_url": f"{server.url}/v1/" if protocol == "openai" else server.url,
        # roomy: a loaded machine (CI builds beside) may stall a loopback reply; tests of timeouts set their own
        "timeouts": {"connect_s": 5, "idle_s": 5, "total_s": 20},
        "retries": {"max_attempts": 3, "backoff_s": 0.01},
        **overrides,
    }
    return ProviderSettings.model_validate(data)


async def chat(server: LlmServer, protocol: str, request: ChatRequest = REQUEST, **overrides: Any) -> ChatReply:
    async with httpx.AsyncClient() as http:
        return await Provider(settings(server, protocol, **overrides), http).chat(request)


async def failure(server: LlmServer, protocol: str, **overrides: Any) -> LlmError:
    with pytest.raises(LlmError) as caught:
        await chat(server, protocol, **overrides)
    return caught.value


@protocols
async def test_a_reply_streams_with_exact_usage(server: LlmServer, protocol: str) -> None:
    server.script(Reply(chunks=("__global__", " void", " k()"), input_tokens=123, output_tokens=45))
    async with httpx.AsyncClient() as http:
        events = [e async for e in Provider(settings(server, protocol), http).stream_chat(REQUEST)]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["__global__", " void", " k()"]
    end = events[-1]
    assert isinstance(end, StreamEnd) and end.usage == Usage(input_tokens=123, output_tokens=45)
    assert end.finish_reason == ("stop" if protocol == "openai" else "end_turn")
    sent = server.requests[0]
    assert sent.body["model"] == "kernel-coder-1" and sent.body["stream"] is True
    assert sent.body["max_tokens"] == 64 and sent.body["temperature"] == 0.2
    if protocol == "openai":
        assert sent.path == "/v1/chat/completions"
        assert sent.body["stream_options"] == {"include_usage": True}
        assert [m["role"] for m in sent.body["messages"]] == ["system", "user"]
    else:
        assert sent.path == "/v1/messages" and sent.headers["anthropic-version"] == "2023-06-01"
        assert sent.body["system"] == "Write CUDA." and [m["role"] for m in sent.body["messages"]] == ["user"]


@protocols
async def test_chat_collects_text_usage_and_times(server: LlmServer, protocol: str) -> None:
    server.script(
        Reply(chunks=("a", "b"), input_tokens=10, output_tokens=2, chunk_delay_s=0.05),
        Reply(
            chunks=("c",), input_tokens=7, output_tokens=1, finish="length" if protocol == "openai" else "max_tokens"
        ),
    )
    first = await chat(server, protocol)
    second = await chat(server, protocol)
    assert (first.text, second.text) == ("ab", "c")
    assert first.usage and second.usage
    assert first.usage.input_tokens + second.usage.input_tokens == 17
    assert first.usage.output_tokens + second.usage.output_tokens == 3
    assert first.first_token_s is not None and 0 < first.first_token_s < first.latency_s
    assert first.latency_s >= 0.05 and first.attempts == 1
    assert not first.truncated and second.truncated


@protocols
async def test_the_key_header_is_sent_only_when_configured(
    server: LlmServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    await chat(server, protocol)
    await chat(server, protocol, api_key_env=KEY_ENV)
    without, with_key = (r.headers for r in server.requests)
    assert "authorization" not in without and "x-api-key" not in without
    if protocol == "openai":
        assert with_key["authorization"] == f"Bearer {SECRET}" and "x-api-key" not in with_key
    else:
        assert with_key["x-api-key"] == SECRET and "authorization" not in with_key


@protocols
async def test_429_waits_for_retry_after(server: LlmServer, protocol: str) -> None:
    server.script(Reply(status=429, headers={"retry-after": "0.4"}))
    start = time.monotonic()
    reply = await chat(server, protocol)
    assert time.monotonic() - start >= 0.4
    assert reply.text == "Hello, world" and reply.attempts == 2 and len(server.requests) == 2


@protocols
async def test_500_then_success_says_it_retries(server: LlmServer, protocol: str) -> None:
    server.script(Reply(status=500))
    async with httpx.AsyncClient() as http:
        events = [e async for e in Provider(settings(server, protocol), http).stream_chat(REQUEST)]
    retries = [e for e in events if isinstance(e, Retrying)]
    assert len(retries) == 1 and retries[0].attempt == 2 and "HTTP 500" in retries[0].reason
    assert isinstance(events[-1], StreamEnd) and len(server.requests) == 2


@protocols
async def test_retries_stop_after_max_attempts(server: LlmServer, protocol: str) -> None:
    server.script(*[Reply(status=503)] * 3)
    err = await failure(server, protocol)
    assert err.kind == "server" and err.attempts == 3 and "after 3 attempts" in str(err)
    assert len(server.requests) == 3


@protocols
@pytest.mark.parametrize("end", ["cut", "short"])
async def test_a_dropped_stream_is_retried_from_scratch(server: LlmServer, protocol: str, end: str) -> None:
    server.script(Reply(chunks=("lost", " text"), end=end))  # type: ignore[arg-type]
    reply = await chat(server, protocol)
    assert reply.text == "Hello, world" and reply.attempts == 2 and len(server.requests) == 2


@protocols
async def test_an_idle_stream_is_caught_and_retried(server: LlmServer, protocol: str) -> None:
    # idle_s 1.0, not less: a loaded 2-core CI machine once took 0.75 s to a good reply's first token
    server.script(Reply(end="stall", stall_s=3.0), Reply(end="stall", stall_s=3.0))
    fast = {"connect_s": 1, "idle_s": 1.0, "total_s": 8}
    start = time.monotonic()
    err = await failure(server, protocol, timeouts=fast, retries={"max_attempts": 1})
    assert err.kind == "idle" and "nothing came for 1 s" in str(err) and time.monotonic() - start < 2.5
    reply = await chat(server, protocol, timeouts=fast)
    assert reply.text == "Hello, world" and reply.attempts == 2


@protocols
async def test_the_total_timeout_stops_a_trickling_stream(server: LlmServer, protocol: str) -> None:
    server.script(Reply(chunks=("x",) * 200, chunk_delay_s=0.05))  # 10 s of text, never idle for 0.3 s
    start = time.monotonic()
    err = await failure(server, protocol, timeouts={"connect_s": 1, "idle_s": 0.3, "total_s": 0.4})
    assert err.kind == "timeout" and "total_s" in str(err) and not err.retryable
    # Cut at 0.4 s; the bound leaves room for a loaded CI machine and is far below the stream's 10 s.
    assert time.monotonic() - start < 3.0 and len(server.requests) == 1


@protocols
@pytest.mark.parametrize(("status", "kind"), [(400, "bad_request"), (401, "auth"), (403, "auth"), (404, "not_found")])
async def test_requests_that_cannot_pass_are_not_retried(
    server: LlmServer, protocol: str, status: int, kind: str
) -> None:
    server.script(Reply(status=status, error="nope"))
    err = await failure(server, protocol)
    assert err.kind == kind and err.status == status and "nope" in str(err)
    assert isinstance(err, KernelForgeError) and len(server.requests) == 1


@protocols
async def test_a_bad_key_names_the_variable_and_never_the_key(
    server: LlmServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.script(Reply(status=401, error=f"Incorrect API key provided: {SECRET}."))
    err = await failure(server, protocol, api_key_env=KEY_ENV)
    assert err.kind == "auth" and f"fake-{protocol}" in str(err) and f"set {KEY_ENV}" in str(err)
    assert SECRET not in str(err) and SECRET not in repr(err) and SECRET not in repr(err.__dict__)


@protocols
async def test_an_unset_key_variable_fails_before_any_request(
    server: LlmServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    err = await failure(server, protocol, api_key_env=KEY_ENV)
    assert err.kind == "no_key" and f"set {KEY_ENV}" in str(err) and server.requests == []


@protocols
async def test_a_reply_that_is_not_a_stream_is_not_retried(server: LlmServer, protocol: str) -> None:
    server.script(Reply(content_type="application/json"))
    err = await failure(server, protocol)
    assert err.kind == "protocol" and "application/json" in str(err) and len(server.requests) == 1


@protocols
async def test_an_unknown_model_says_to_check_the_name(server: LlmServer, protocol: str) -> None:
    server.script(Reply(status=404, error="model not found"))
    err = await failure(server, protocol)
    assert "check the model name (kernel-coder-1)" in str(err) and err.attempts == 1


async def test_the_key_is_never_in_settings_or_provider(server: LlmServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    config = settings(server, "openai", api_key_env=KEY_ENV)
    async with httpx.AsyncClient() as http:
        provider = Provider(config, http)
        await provider.chat(REQUEST)
        shown = [repr(config), str(config), config.model_dump_json(), repr(provider), repr(provider.__dict__)]
    assert config.api_key() == SECRET
    assert all(SECRET not in text for text in shown) and KEY_ENV in repr(config)


@protocols
async def test_cancelling_the_caller_closes_the_stream_at_once(server: LlmServer, protocol: str) -> None:
    server.script(Reply(end="hold"))
    async with httpx.AsyncClient() as http:
        task = asyncio.create_task(Provider(settings(server, protocol), http).chat(REQUEST))
        assert await asyncio.to_thread(server.first_chunk_sent.wait, 2.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(server.client_left.wait, 1.0)


@protocols
async def test_cancelling_a_consumer_between_deltas_closes_the_stream(server: LlmServer, protocol: str) -> None:
    """The consumer is busy with a delta, not awaiting the network, when it is cancelled."""
    server.script(Reply(end="hold"))
    busy = asyncio.Event()

    async def consume(provider: Provider) -> None:
        async with aclosing(provider.stream_chat(REQUEST)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    busy.set()
                    await asyncio.sleep(10)

    async with httpx.AsyncClient() as http:
        task = asyncio.create_task(consume(Provider(settings(server, protocol), http)))
        await asyncio.wait_for(busy.wait(), 2.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert all(c.is_closed() for c in http._transport._pool.connections)  # type: ignore[attr-defined]
        assert await asyncio.to_thread(server.client_left.wait, 1.0)


@protocols
async def test_the_concurrency_limit_holds(server: LlmServer, protocol: str) -> None:
    server.script(*[Reply(chunk_delay_s=0.03)] * 6)
    async with httpx.AsyncClient() as http:
        provider = Provider(settings(server, protocol, max_concurrency=2), http)
        replies = await asyncio.gather(*(provider.chat(REQUEST) for _ in range(6)))
    assert [r.text for r in replies] == ["Hello, world"] * 6
    assert server.max_active == 2 and len(server.requests) == 6


def test_a_client_that_resets_mid_request_prints_nothing_into_the_output_a_test_reads(
    server: LlmServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fake server keeps its own errors off stderr: a CLI test reads what its command printed there."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
        time.sleep(0.2)  # the handler is reading the body
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed with a reset
    time.sleep(0.5)  # the handler fails
    assert capsys.readouterr().err == ""
