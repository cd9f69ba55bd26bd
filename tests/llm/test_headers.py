"""Custom headers on a provider (issue 30): attribution and gateway headers as configured, the secret ones (Azure's
`api-key`, a gateway's key) read from the environment like the key and masked like it in everything a run stores,
and a header that reads like a secret refused in the recorded config. Against the loopback server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernelforge_tui.config import LlmSettings, ModelSettings, ProviderSettings, Retries, Timeouts
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.llm.masking import MASK
from tests.engine.test_search_llm import PRICE, collect, kernel_reply, make_search
from tests.llm.test_llm import chat, failure, protocols
from tests.support.fakes.llm_server import LlmServer, Reply

AZURE_KEY = "azure-0123456789abcdef-SECRET"
GATEWAY_KEY = "gw-0123456789abcdef-SECRET"
KEY = "sk-0123456789abcdef-SECRET"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LlmServer]:
    monkeypatch.setenv("KF_AZURE_KEY", AZURE_KEY)
    monkeypatch.setenv("KF_GATEWAY_KEY", GATEWAY_KEY)
    monkeypatch.setenv("KF_KEY", KEY)
    with LlmServer() as running:
        yield running


async def test_azure_api_key_and_attribution_headers_reach_the_server(server: LlmServer) -> None:
    headers = {"HTTP-Referer": "https://github.com/kernelforge", "X-Title": "Kernel Forge"}
    await chat(server, "openai", headers=headers, headers_env={"api-key": "KF_AZURE_KEY"})
    (seen,) = server.requests
    assert seen.headers["api-key"] == AZURE_KEY and "authorization" not in seen.headers  # no api_key_env: no bearer
    assert seen.headers["http-referer"] == "https://github.com/kernelforge"
    assert seen.headers["x-title"] == "Kernel Forge"


async def test_a_gateways_key_goes_beside_the_providers_and_configured_headers_win(server: LlmServer) -> None:
    await chat(
        server,
        "anthropic",
        api_key_env="KF_KEY",
        headers={"anthropic-version": "2024-10-22", "anthropic-beta": "prompt-caching-2024-07-31"},
        headers_env={"cf-aig-authorization": "KF_GATEWAY_KEY"},
    )
    (seen,) = server.requests
    assert seen.headers["x-api-key"] == KEY and seen.headers["cf-aig-authorization"] == GATEWAY_KEY
    assert seen.headers["anthropic-version"] == "2024-10-22" and seen.headers["anthropic-beta"].startswith("prompt")


@protocols
async def test_an_unset_header_variable_fails_before_any_request(
    server: LlmServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KF_AZURE_KEY")
    err = await failure(server, protocol, headers_env={"api-key": "KF_AZURE_KEY"})
    assert err.kind == "no_key" and "$KF_AZURE_KEY is not set" in str(err) and "header api-key" in err.fix
    assert server.requests == []


@protocols
async def test_a_header_secret_echoed_back_is_masked(
    server: LlmServer, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.script(Reply(status=401, error=f"gateway refused {GATEWAY_KEY}"))
    err = await failure(server, protocol, headers_env={"x-gateway-key": "KF_GATEWAY_KEY"})
    assert err.kind == "auth" and GATEWAY_KEY not in str(err) and MASK in str(err)
    assert "KF_GATEWAY_KEY" in err.fix  # the variable to check, not the value
    monkeypatch.setenv("KF_GATEWAY_KEY", f"Bearer {GATEWAY_KEY}")  # a value with its scheme: the token is masked too
    server.script(Reply(status=401, error=f"token {GATEWAY_KEY} is revoked"))
    err = await failure(server, protocol, headers_env={"cf-aig-authorization": "KF_GATEWAY_KEY"})
    assert server.requests[-1].headers["cf-aig-authorization"] == f"Bearer {GATEWAY_KEY}"
    assert GATEWAY_KEY not in str(err) and "token *** is revoked" in str(err)


async def test_header_secrets_reach_neither_the_store_nor_the_events(tmp_path: Path, server: LlmServer) -> None:
    echoing = kernel_reply(128, 1)
    echoing.chunks = (f"// routed with {AZURE_KEY} and {GATEWAY_KEY}\n" + echoing.chunks[0], *echoing.chunks[1:])
    server.script(echoing, kernel_reply(256, 1))
    llm = LlmSettings(
        providers=[
            ProviderSettings(
                name="azure",
                protocol="openai",
                base_url=f"{server.url}/v1",
                headers={"X-Title": "Kernel Forge"},
                headers_env={"api-key": "KF_AZURE_KEY", "x-gateway-key": "KF_GATEWAY_KEY"},
                retries=Retries(max_attempts=1),
                timeouts=Timeouts(idle_s=5, total_s=20),
            )
        ],
        models=[ModelSettings(name="m", provider="azure", model="test-model", price=PRICE)],
    )
    search, _ = make_search(tmp_path, llm, Budget(max_iterations=2))
    events, _ = await collect(search)
    assert server.requests[0].headers["api-key"] == AZURE_KEY  # sent, to the provider only
    assert MASK in (search.store.llm_calls()[0].reply or "")
    search.store.close()
    for path in (tmp_path / "run").iterdir():
        data = path.read_bytes()
        assert AZURE_KEY.encode() not in data and GATEWAY_KEY.encode() not in data, path
    assert all(AZURE_KEY not in e.model_dump_json() and GATEWAY_KEY not in e.model_dump_json() for e in events)


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({"headers": {"api-key": "azure-123"}}, 'headers_env = { "api-key" = "YOUR_VARIABLE" }'),
        ({"headers": {"Authorization": "Bearer x"}}, "reads like a secret"),
        ({"headers": {"X-Title": "a\nb"}}, "control character"),
        ({"headers": {"content-type": "text/plain"}}, "set by the HTTP client"),
        ({"headers": {"bad header": "x"}}, "not a header name"),
        ({"headers": {"X-Title": "a"}, "headers_env": {"x-title": "V"}}, "given twice"),
    ],
)
def test_headers_that_cannot_be_sent_as_given_are_refused_with_the_fix(headers: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("{", r"\{").replace("}", r"\}")):
        ProviderSettings.model_validate({"name": "p", "protocol": "openai", "base_url": "http://x/v1", **headers})
