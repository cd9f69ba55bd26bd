"""Request options and how a stream ends (issue 30): `stream_options` can be turned off for servers that reject it,
a stream that closes without its terminator after the final usage and finish reason is whole (not retried, not paid
twice), an error the stream reports that no retry can pass (a context too long, an invalid request) is not retried,
and a refusal (`content_filter`, `refusal`) is its own outcome, not an unusable reply. Against the loopback server."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kernelforge_tui.config import ProviderSettings
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.search import MAX_LLM_FAILURES
from kernelforge_tui.engine.view import describe
from kernelforge_tui.llm import LlmError, Usage
from kernelforge_tui.vocabulary.events import LlmCallEnded, LogLine
from kernelforge_tui.vocabulary.llm import LlmTotals
from tests.engine.test_search_llm import collect, llm_settings, make_search
from tests.llm.test_llm import chat, failure, protocols
from tests.llm.test_spend import PROMPT_TOKENS, ask, client_settings
from tests.support.fakes.agent_replies import RecordingSink
from tests.support.fakes.llm_server import LlmServer, Reply


@pytest.fixture
def server() -> Iterator[LlmServer]:
    with LlmServer() as running:
        yield running


async def test_stream_options_can_be_turned_off_and_the_usage_is_then_estimated(server: LlmServer) -> None:
    reply = await chat(server, "openai", stream_options=False)
    (sent,) = server.requests
    assert "stream_options" not in sent.body and reply.text == "Hello, world"
    # the server sent no usage (it was not asked): the prompt and the whole reply, estimated
    assert reply.usage == Usage(input_tokens=PROMPT_TOKENS, output_tokens=math.ceil(12 / 3), estimated=True)
    await chat(server, "openai")
    assert server.requests[1].body["stream_options"] == {"include_usage": True}  # on by default


def test_stream_options_is_an_option_of_the_openai_protocol_only() -> None:
    with pytest.raises(ValidationError, match="stream_options is an option of protocol openai"):
        ProviderSettings(name="a", protocol="anthropic", base_url="http://x", stream_options=False)


@protocols
async def test_a_stream_without_its_terminator_after_the_final_usage_is_whole(server: LlmServer, protocol: str) -> None:
    server.script(Reply(end="no_terminal", input_tokens=40, output_tokens=7))
    reply = await chat(server, protocol)
    assert len(server.requests) == 1 and reply.attempts == 1  # not retried, not paid twice
    assert reply.text == "Hello, world" and reply.usage == Usage(input_tokens=40, output_tokens=7)
    assert reply.finish_reason == ("stop" if protocol == "openai" else "end_turn")


@pytest.mark.parametrize(
    ("protocol", "error", "kind"),
    [
        (
            "openai",
            {"message": "maximum context length is 8192 tokens", "type": "invalid_request_error",
             "code": "context_length_exceeded"},
            "bad_request",
        ),
        ("openai", {"message": "prompt too long", "type": "BadRequestError", "code": 400}, "bad_request"),  # vLLM
        ("openai", {"message": "bad key", "type": "invalid_request_error", "code": "invalid_api_key"}, "auth"),
        ("anthropic", {"type": "invalid_request_error", "message": "prompt is too long"}, "bad_request"),
        ("anthropic", {"type": "authentication_error", "message": "invalid x-api-key"}, "auth"),
    ],
)  # fmt: skip
async def test_an_error_in_the_stream_that_cannot_pass_is_not_retried(
    server: LlmServer, protocol: str, error: dict[str, Any], kind: str
) -> None:
    server.script(Reply(end="error", stream_error=error))
    err = await failure(server, protocol)
    assert err.kind == kind and not err.retryable and len(server.requests) == 1, err
    assert str(error["message"]) in str(err)
    if kind == "bad_request":
        assert "llm.agents.prompt_tokens" in err.fix


@protocols
async def test_an_overloaded_server_in_the_stream_is_retried(server: LlmServer, protocol: str) -> None:
    overloaded = {"type": "overloaded_error", "message": "Overloaded"}
    server.script(Reply(end="error", stream_error=overloaded))
    reply = await chat(server, protocol)
    assert reply.text == "Hello, world" and len(server.requests) == 2


@pytest.mark.parametrize(
    ("protocol", "reply"),
    [
        ("openai", Reply(chunks=("I can't",), finish="content_filter")),
        ("openai", Reply(chunks=("I can't help with that.",), refusal=True)),
        ("anthropic", Reply(chunks=("I won't",), finish="refusal")),
    ],
)
async def test_a_refusal_is_recorded_and_raised_as_one(server: LlmServer, protocol: str, reply: Reply) -> None:
    server.script(reply)
    sink = RecordingSink()
    with pytest.raises(LlmError) as caught:
        await ask(client_settings(server.url, protocol, "gpt-4o"), sink)
    assert caught.value.kind == "refused" and not caught.value.retryable and len(server.requests) == 1
    (call,) = sink.calls
    assert call.outcome == "refused" and call.reply == "".join(reply.chunks) and "refused the request" in call.error
    logged = describe(LlmCallEnded(call_key="k", call=call, totals=LlmTotals().plus(call)), None)
    assert logged is not None and logged.level == "warning" and "refused" in logged.text


async def test_a_refusal_in_a_search_is_logged_as_one_and_writes_no_node(
    tmp_path: Path, server: LlmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_TEST_KEY", "sk-test-refusals-0123")
    server.script(*[Reply(chunks=("Sorry, no.",), finish="content_filter")] * MAX_LLM_FAILURES)
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=1))
    events, _ = await collect(search)
    logs = [e.text for e in events if isinstance(e, LogLine)]
    assert any("refused the request (finish reason content_filter)" in line for line in logs), logs
    assert not any("cuda" in line.lower() and "blocks" in line for line in logs)
    assert [n.id for n in search.store.nodes() if n.parent_id is not None] == []  # no "0 CUDA blocks" failed node
    assert [c.outcome for c in search.store.llm_calls()] == ["refused"] * MAX_LLM_FAILURES
    assert f"failed {MAX_LLM_FAILURES} times in a row" in search.store.run_info().reason
    search.store.close()
