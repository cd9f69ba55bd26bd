"""What a provider sends is untrusted (issue 35): the bytes read from a reply and from an error body are bounded,
the key is masked out of everything the run stores even when a server echoes it, a Retry-After that is not a
number of seconds falls back to the backoff, and a redirect names base_url. Against the loopback server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.llm import ChatMessage, LlmClient, LlmError, Provider, Retrying, TextDelta
from kernelforge_tui.llm.masking import MASK, Masker
from kernelforge_tui.llm.wire import sse_lines
from kernelforge_tui.vocabulary.events import LlmText
from tests.engine.test_search import toy_kernel
from tests.engine.test_search_llm import collect, llm_settings, make_search
from tests.llm.test_llm import KEY_ENV, REQUEST, SECRET, chat, failure, protocols, settings
from tests.support.fakes.agent_replies import RecordingSink
from tests.support.fakes.llm_server import LlmServer, Reply, Seen

MIB = 1024 * 1024


@pytest.fixture
def server() -> Iterator[LlmServer]:
    with LlmServer() as running:
        yield running


# ---- 1. the bytes of one reply are capped ---------------------------------------------------------------------


@protocols
async def test_an_endless_stream_is_cut_at_the_reply_cap_and_not_retried(server: LlmServer, protocol: str) -> None:
    server.script(Reply(chunks=("x" * 1000,), end="endless"))
    err = await failure(server, protocol, limits={"reply_bytes": 64 * 1024})
    assert err.kind == "too_large" and not err.retryable and err.attempts == 1 and len(server.requests) == 1
    assert "limits.reply_bytes (65536 bytes)" in str(err) and f"fake-{protocol}" in str(err)
    assert server.client_left.wait(5)  # the client closed the stream; the server did not end it


@protocols
async def test_a_reply_within_the_cap_is_read_whole(server: LlmServer, protocol: str) -> None:
    server.script(Reply(chunks=("y" * 1000,) * 8))
    reply = await chat(server, protocol, limits={"reply_bytes": 64 * 1024})
    assert reply.text == "y" * 8000


async def test_lines_split_as_server_sent_events_split_them_across_chunks() -> None:
    async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    pieces = (b"data: a\r", b"\n\r", b"\ndata: \xc3", b"\xa9\rdata: b\n", b"\n", b"data: end")
    assert [line async for line in sse_lines(chunks(*pieces))] == [
        "data: a",
        "",
        "data: \u00e9",
        "data: b",
        "",
        "data: end",
    ]


# ---- 2. error bodies are read up to a small limit ------------------------------------------------------------


@protocols
async def test_a_big_error_body_is_read_only_up_to_its_limit(server: LlmServer, protocol: str) -> None:
    total = 64 * MIB
    server.script(Reply(status=400, error="nope", error_bytes=total))
    slow = {"connect_s": 1, "idle_s": 5, "total_s": 10}
    err = await failure(server, protocol, limits={"error_bytes": 1024}, timeouts=slow, retries={"max_attempts": 1})
    assert err.kind == "bad_request" and "nope" in str(err) and len(server.requests) == 1
    assert server.client_left.wait(5)  # the client closed the connection before the body ended
    assert server.body_bytes_sent < total / 2


# ---- 3. the key never reaches the store ----------------------------------------------------------------------


@pytest.mark.parametrize("cut", range(len(SECRET) + 2))
def test_a_stream_is_masked_wherever_its_pieces_split_the_key(cut: int) -> None:
    text = f"a {SECRET} b {SECRET}{SECRET}"
    masker = Masker(SECRET)
    streamed = masker.feed(text[:cut]) + masker.feed(text[cut:]) + masker.flush()
    assert streamed == masker(text) == f"a {MASK} b {MASK}{MASK}"
    assert Masker(SECRET).feed(f"x {SECRET[:cut]}") in ("x ", f"x {MASK}")  # text cut short keeps no part of it


def test_a_placeholder_key_of_a_local_server_is_not_a_secret() -> None:
    assert Masker("EMPTY")("EMPTY rows") == "EMPTY rows" and Masker(None)("text") == "text"


@protocols
async def test_a_key_the_server_echoes_is_masked_in_the_reply_and_its_stream(
    server: LlmServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.script(Reply(chunks=(f"key: {SECRET[:7]}", f"{SECRET[7:]} again {SECRET[:3]}", f"{SECRET[3:]}.")))
    seen: list[str] = []
    async with httpx.AsyncClient() as http:
        provider = Provider(settings(server, protocol, api_key_env=KEY_ENV), http)
        reply = await provider.chat(REQUEST, lambda text, retry: seen.append(text))
    assert reply.text == f"key: {MASK} again {MASK}." == "".join(seen)
    assert all(SECRET[:7] not in text for text in seen)


@protocols
async def test_an_error_body_cut_inside_the_key_keeps_no_part_of_it(
    server: LlmServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.script(Reply(status=400, error=f"bad key {SECRET}"))
    opening = b'{"type": "error", "error": {"type": "scripted", "message": "bad key '
    err = await failure(server, protocol, api_key_env=KEY_ENV, limits={"error_bytes": len(opening) + 12})
    assert "bad key" in str(err) and SECRET[:12] not in str(err) and SECRET[:4] not in str(err)


async def test_the_call_recorded_has_the_key_masked_out_of_its_prompt(
    server: LlmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_TEST_KEY", SECRET)
    sink = RecordingSink()
    async with LlmClient(llm_settings(server.url), sink) as client:
        await client.ask("coder", "m", [ChatMessage(role="user", content=f"a hint: {SECRET}")], str)
    (call,) = sink.calls
    assert call.prompt is not None and f"a hint: {MASK}" in call.prompt and SECRET not in call.prompt


class EchoingProvider:
    """A responder that writes the key it was sent into every kind of answer: kernels (in their prose and their
    source, the key split across chunks) for the root's first batch of 4, then an error body, then a reply the coder
    cannot use, then kernels again."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def __call__(self, seen: Seen) -> Reply:
        key = seen.headers["authorization"].removeprefix("Bearer ")
        turn = len(self.keys)
        self.keys.append(key)
        if turn == 4:
            return Reply(status=500, error=f"overloaded, key {key}")
        if turn == 5:
            return Reply(chunks=(f"no code, but the key {key[:9]}", key[9:]))
        kernel = toy_kernel(32 * (turn + 1), 1)
        text = f"Echo {key}.\n```cuda\n{kernel.source}// {key}\n```\n```json\n{kernel.plan.model_dump_json()}\n```\n"
        split = text.rindex(key) + 5
        return Reply(chunks=(text[:split], text[split:]))


async def test_a_key_the_provider_echoes_reaches_nowhere_in_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-test-ECHOED-0123456789"
    monkeypatch.setenv("KF_TEST_KEY", key)
    echoing = EchoingProvider()
    with LlmServer(responder=echoing) as server:
        search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=8))
        events, _ = await collect(search)
        store = search.store
        outcomes = {c.outcome for c in store.llm_calls()}
        sources = [store.node_record(n.id).source for n in store.nodes() if n.proposer == "agents:m"]
        open_files = {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir()}  # the -wal too
        store.close()
    assert len(echoing.keys) >= 6 and set(echoing.keys) == {key}  # every request carried it, every answer echoed it
    assert outcomes == {"ok", "error", "malformed"}
    assert sources and all(MASK in source and key not in source for source in sources)
    streamed = "".join(e.text for e in events if isinstance(e, LlmText))
    assert MASK in streamed and all(key not in e.model_dump_json() for e in events)
    assert any(name.endswith("-wal") and data for name, data in open_files.items())
    for data in [*open_files.values(), *(path.read_bytes() for path in (tmp_path / "run").iterdir())]:
        assert key.encode() not in data and key[:12].encode() not in data


# ---- 4. a Retry-After that is not a number of seconds --------------------------------------------------------


@protocols
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-3", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"])
async def test_a_retry_after_that_is_no_wait_falls_back_to_the_backoff(
    server: LlmServer, protocol: str, value: str
) -> None:
    server.script(Reply(status=429, headers={"retry-after": value}))
    async with httpx.AsyncClient() as http:
        provider = Provider(settings(server, protocol, retries={"max_attempts": 3, "backoff_s": 0.02}), http)
        events = [e async for e in provider.stream_chat(REQUEST)]
    (retry,) = [e for e in events if isinstance(e, Retrying)]
    assert 0.01 <= retry.delay_s <= 0.02  # attempt 1's backoff: backoff_s, the upper half jittered
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello, world"


@protocols
async def test_a_retry_after_in_seconds_is_kept(server: LlmServer, protocol: str) -> None:
    server.script(Reply(status=503, headers={"retry-after": "0.05"}))
    async with httpx.AsyncClient() as http:
        events = [e async for e in Provider(settings(server, protocol), http).stream_chat(REQUEST)]
    assert [e.delay_s for e in events if isinstance(e, Retrying)] == [0.05]


# ---- 5. a redirect ----------------------------------------------------------------------------------------------


@protocols
@pytest.mark.parametrize("status", [301, 307, 308])
async def test_a_redirect_says_to_fix_base_url(server: LlmServer, protocol: str, status: int) -> None:
    server.script(Reply(status=status, headers={"location": "https://api.example.com/v1/chat/completions"}))
    err = await failure(server, protocol)
    assert isinstance(err, LlmError) and err.kind == "redirect" and err.status == status and not err.retryable
    assert f"HTTP {status}" in str(err) and "to https://api.example.com/v1/chat/completions" in str(err)
    assert "set base_url" in err.fix and "max_tokens" not in str(err) and len(server.requests) == 1
