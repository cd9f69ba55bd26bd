"""What a call cost, from what the provider reported (issue 30): an attempt the server took and then lost (a broken,
stalled or cancelled stream) counts the tokens it had reported (Anthropic's `message_start`, OpenAI's usage chunks)
and an upper-bound estimate for the rest, marked as one; an attempt refused with an HTTP status costs nothing; cached
input tokens are counted and priced apart; and a money cap then holds within one call's cost. Against the loopback
server, through the real client, store and search."""

from __future__ import annotations

import asyncio
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernelforge_tui.config import LlmSettings, ModelSettings, ProviderSettings, Retries, Timeouts
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.view import call_summary
from kernelforge_tui.llm import ChatMessage, LlmClient, LlmError, Provider, Usage
from kernelforge_tui.llm.pricing import CHARS_PER_TOKEN
from kernelforge_tui.llm.types import Spend
from kernelforge_tui.store import DB_NAME, RunStore
from tests.engine.test_search_llm import PRICE, collect, kernel_reply, make_search
from tests.llm.test_llm import REQUEST, protocols, settings
from tests.support.fakes.agent_replies import RecordingSink
from tests.support.fakes.llm_server import LlmServer, Reply

PROMPT_TOKENS = math.ceil(sum(len(m.content) for m in REQUEST.messages) / CHARS_PER_TOKEN)
"""The estimate of REQUEST's prompt (its max_tokens, 64, is the estimate of a cut reply's output)."""


@pytest.fixture
def server() -> Iterator[LlmServer]:
    with LlmServer() as running:
        yield running


async def chat_spend(server: LlmServer, protocol: str, **overrides: object) -> tuple[Spend, BaseException | None]:
    spend = Spend()
    async with httpx.AsyncClient() as http:
        try:
            await Provider(settings(server, protocol, **overrides), http).chat(REQUEST, spend=spend)
        except LlmError as err:
            return spend, err
    return spend, None


async def test_a_broken_anthropic_stream_counts_the_input_message_start_reported(server: LlmServer) -> None:
    server.script(Reply(end="cut", input_tokens=900), Reply(input_tokens=900, output_tokens=5))
    spend, failed = await chat_spend(server, "anthropic")
    assert failed is None and len(server.requests) == 2
    lost, kept = spend.attempts
    assert lost == Usage(input_tokens=900, output_tokens=64, estimated=True)  # output: the request's cap
    assert kept == Usage(input_tokens=900, output_tokens=5)
    assert spend.total() == Usage(input_tokens=1800, output_tokens=69, estimated=True)


@pytest.mark.parametrize("every_chunk", [True, False])
async def test_a_broken_openai_stream_counts_its_usage_chunks_or_an_estimate(
    server: LlmServer, every_chunk: bool
) -> None:
    server.script(Reply(end="cut", input_tokens=900, usage_every_chunk=every_chunk))
    spend, failed = await chat_spend(server, "openai", retries={"max_attempts": 1})
    assert isinstance(failed, LlmError) and failed.kind == "dropped"
    (lost,) = spend.attempts
    assert lost.input_tokens == (900 if every_chunk else PROMPT_TOKENS) and lost.output_tokens == 64 and lost.estimated


@protocols
async def test_a_stalled_attempt_is_counted(server: LlmServer, protocol: str) -> None:
    server.script(Reply(end="stall", stall_s=1.0, input_tokens=700))
    fast = {"connect_s": 1, "idle_s": 0.2, "total_s": 5}
    spend, failed = await chat_spend(server, protocol, timeouts=fast, retries={"max_attempts": 1})
    assert isinstance(failed, LlmError) and failed.kind == "idle"
    (stalled,) = spend.attempts
    assert stalled.estimated and stalled.output_tokens == 64
    assert stalled.input_tokens == (700 if protocol == "anthropic" else PROMPT_TOKENS)


@protocols
async def test_an_attempt_refused_with_a_status_costs_nothing(server: LlmServer, protocol: str) -> None:
    server.script(Reply(status=503), Reply(input_tokens=20, output_tokens=3))
    spend, failed = await chat_spend(server, protocol)
    assert failed is None and spend.attempts == [Usage(input_tokens=20, output_tokens=3)]


def client_settings(url: str, protocol: str, model: str, **provider: object) -> LlmSettings:
    return LlmSettings(
        providers=[
            ProviderSettings.model_validate(
                {
                    "name": "loop",
                    "protocol": protocol,
                    "base_url": f"{url}/v1" if protocol == "openai" else url,
                    "timeouts": {"idle_s": 5, "total_s": 20},
                    "retries": {"max_attempts": 1},
                    **provider,
                }
            )
        ],
        models=[ModelSettings(name="m", provider="loop", model=model, max_tokens=100)],
    )


async def ask(llm: LlmSettings, sink: RecordingSink) -> None:
    async with LlmClient(llm, sink) as client:
        await client.ask("coder", "m", [ChatMessage(role="user", content="softmax, please")], str)


async def test_a_cancelled_call_is_recorded_with_the_input_tokens_reported(server: LlmServer) -> None:
    server.script(Reply(end="hold", input_tokens=1234))
    sink = RecordingSink()
    task = asyncio.create_task(ask(client_settings(server.url, "anthropic", "claude-sonnet-4-5"), sink))
    assert await asyncio.to_thread(server.first_chunk_sent.wait, 5)
    await asyncio.sleep(0.05)  # the client has read message_start
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (call,) = sink.calls
    assert call.outcome == "cancelled" and call.input_tokens == 1234 and call.output_tokens == 100 and call.estimated
    assert call.cost_nanousd == 1234 * 3000 + 100 * 15000  # claude-sonnet-4-5's list price
    assert "(estimated)" in call_summary(call)


@pytest.mark.parametrize(
    ("protocol", "model", "write", "expected"),
    [
        # Anthropic: 200 uncached at 3 USD/Mtok, 300 written at 3.75, 1000 read at 0.3, 50 out at 15
        ("anthropic", "claude-sonnet-4-5-20250929", 300, 200 * 3000 + 300 * 3750 + 1000 * 300 + 50 * 15000),
        # OpenAI: 500 uncached at 2.5, 1000 read at 1.25, 50 out at 10 (it reports no cache writes)
        ("openai", "gpt-4o-2024-08-06", 0, 500 * 2500 + 1000 * 1250 + 50 * 10000),
    ],
)
async def test_cached_tokens_are_counted_and_priced_apart(
    server: LlmServer, protocol: str, model: str, write: int, expected: int
) -> None:
    server.script(Reply(input_tokens=1500, output_tokens=50, cache_write_tokens=write, cache_read_tokens=1000))
    sink = RecordingSink()
    await ask(client_settings(server.url, protocol, model), sink)
    (call,) = sink.calls
    assert (call.input_tokens, call.cache_write_tokens, call.cache_read_tokens) == (1500, write, 1000)
    assert call.cost_nanousd == expected and not call.estimated
    assert f"({write + 1000:,} cached)" in call_summary(call)


async def test_a_money_cap_holds_within_one_call_when_attempts_break(tmp_path: Path, server: LlmServer) -> None:
    """Every call's first attempt breaks after the server took it (and billed it); the second answers. Counted as 0,
    the lost attempts would let the run spend about twice its cap."""
    per_request = 11 * 1500 + 5 * 7250  # what the server bills each request it takes, at PRICE
    kernels = [kernel_reply(b, v) for b in (64, 128, 256, 512) for v in (1, 2, 4)]
    server.script(*(r for k in kernels for r in (Reply(end="cut"), k)))
    llm = LlmSettings(
        providers=[
            ProviderSettings(
                name="loop",
                protocol="anthropic",
                base_url=server.url,
                retries=Retries(max_attempts=2, backoff_s=0.01),
                timeouts=Timeouts(idle_s=5, total_s=20),
            )
        ],
        models=[ModelSettings(name="m", provider="loop", model="test-model", price=PRICE, max_tokens=16)],
    )
    cap_nanousd = 3 * per_request
    search, _ = make_search(tmp_path, llm, Budget(max_money=cap_nanousd / 1e9))
    await collect(search)
    assert "money budget reached" in search.store.run_info().reason
    calls = search.store.llm_calls()
    billed = len(server.requests) * per_request
    spent = search.store.llm_totals().cost_nanousd
    assert spent >= billed  # the estimate errs high, never low
    assert billed <= cap_nanousd + 2 * per_request  # within one call (two requests) of the cap
    assert spent <= cap_nanousd + max(c.cost_nanousd for c in calls)
    assert all(c.estimated and c.attempts == 2 and c.input_tokens == 22 for c in calls)  # read back from the store
    search.store.close()
    # the same calls in a run written before schema 5 (no cache columns) read back as calls with neither
    conn = sqlite3.connect(tmp_path / "run" / DB_NAME)
    for column in ("cache_write_tokens", "cache_read_tokens", "estimated"):
        conn.execute(f"ALTER TABLE llm_calls DROP COLUMN {column}")
    conn.execute("UPDATE schema_version SET version = 4")
    conn.commit()
    conn.close()
    with RunStore.open(tmp_path / "run", readonly=True) as old:
        assert [(c.input_tokens, c.estimated, c.cache_read_tokens) for c in old.llm_calls()] == [(22, False, 0)] * len(
            calls
        )
