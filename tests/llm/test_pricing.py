"""Prices by normalised model id (issue 30): a vendor prefix, a date suffix and case do not make a model free, the
user's `[llm.pricing]` wins, cached tokens have their own prices, a money budget with an unpriced model is refused
before the run starts (exit 2, naming the line to add), and `kernelforge doctor` lists the unpriced models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernelforge_tui.cli.doctor import llm_checks
from kernelforge_tui.cli.main import main
from kernelforge_tui.config import LlmSettings, ModelSettings, Price, ProviderSettings, price_key
from tests.support.fakes.agent_replies import CARD_DIR


def team(*ids: str, protocol: str = "openai", pricing: dict[str, Price] | None = None) -> LlmSettings:
    return LlmSettings(
        providers=[ProviderSettings(name="p", protocol=protocol, base_url="http://127.0.0.1:1/v1")],  # type: ignore[arg-type]
        models=[ModelSettings(name=f"m{i}", provider="p", model=model_id) for i, model_id in enumerate(ids)],
        pricing=pricing or {},
    )


def price_of(model_id: str, **kwargs: object) -> Price | None:
    llm = team(model_id, **kwargs)  # type: ignore[arg-type]
    return llm.price(llm.models[0])


@pytest.mark.parametrize(
    ("model_id", "listed"),
    [
        ("anthropic/claude-sonnet-4.5", "claude-sonnet-4-5"),  # OpenRouter: vendor prefix, dotted version
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),  # a dated snapshot
        ("claude-haiku-4-5@20251001", "claude-haiku-4-5"),  # Vertex's snapshot form
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("openai/gpt-4o-mini", "gpt-4o-mini"),  # not gpt-4o's price
        ("OpenAI/GPT-4.1", "gpt-4.1"),
        ("deepseek/deepseek-chat", "deepseek-chat"),
        ("o3-2025-04-16", "o3"),
    ],
)
def test_a_model_is_priced_by_its_normalised_id(model_id: str, listed: str) -> None:
    price = price_of(model_id)
    assert price is not None and price_key(model_id) == price_key(listed)
    expected = price_of(listed)
    assert expected is not None and (price.input, price.output) == (expected.input, expected.output)


def test_unknown_and_near_miss_ids_stay_unpriced() -> None:
    assert price_of("my-finetune") is None
    assert price_of("claude-sonnet-4-5-turbo") is None  # only a date or -latest is dropped, never a word
    assert price_of("qwen2.5-coder:32b") is None


def test_the_users_table_wins_over_the_defaults_and_an_exact_entry_over_a_normalised_one() -> None:
    mine = Price(input=9.0, output=9.5)
    assert price_of("anthropic/claude-sonnet-4.5", pricing={"anthropic/claude-sonnet-4.5": mine}) == mine.model_copy(
        update={"cache_write": 9.0, "cache_read": 4.5}  # its cache prices from the provider's protocol (openai)
    )
    normalised = price_of("claude-sonnet-4-5-20250929", pricing={"Claude-Sonnet-4.5": mine})
    assert normalised is not None and normalised.input == 9.0
    dated = Price(input=1.0, output=2.0)
    exact = price_of("gpt-4o-2024-05-13", pricing={"gpt-4o": mine, "gpt-4o-2024-05-13": dated})
    assert exact is not None and exact.input == 1.0


def test_cache_prices_come_from_the_entry_or_the_protocols_multipliers() -> None:
    sonnet = price_of("claude-sonnet-4-5", protocol="anthropic")
    assert sonnet is not None and (sonnet.cache_write, sonnet.cache_read) == (3.75, 0.3)  # listed
    own = Price(input=2.0, output=4.0)
    anthropic = price_of("x", protocol="anthropic", pricing={"x": own})
    openai = price_of("x", protocol="openai", pricing={"x": own})
    assert anthropic is not None and (anthropic.cache_write, anthropic.cache_read) == (2.5, pytest.approx(0.2))
    assert openai is not None and (openai.cache_write, openai.cache_read) == (2.0, 1.0)
    overridden = price_of("x", protocol="anthropic", pricing={"x": own.model_copy(update={"cache_read": 0.0})})
    assert overridden is not None and overridden.cache_read == 0.0


CONFIG = """
[[llm.providers]]
name = "router"
protocol = "openai"
base_url = "http://127.0.0.1:9/v1"

[[llm.models]]
name = "writer"
provider = "router"
model = "anthropic/claude-sonnet-4.5"

[[llm.models]]
name = "local"
provider = "router"
model = "my-finetune"

[llm.roles]
coder = ["writer", "local"]
"""


def test_a_money_budget_with_an_unpriced_model_is_refused_before_the_run_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Path(os.environ["KERNELFORGE_CONFIG"]).write_text(CONFIG)
    root = tmp_path / "runs"
    args = ["optimize", str(CARD_DIR), "--proposer", "agents", "--simulate", "--root", str(root)]
    code = main([*args, "--budget-money", "0.5", "--json"])
    failure = json.loads(capsys.readouterr().out)
    assert code == 2 and failure["error"] == "bad-input", failure
    unpriced = failure["message"].split("none for ")[1].split(": add")[0]
    assert unpriced == "local (my-finetune at router)"  # the writer is priced by its normalised id
    assert '"my-finetune" = { input = 0.0, output = 0.0 }' in failure["message"]  # the line to add, whole
    assert not root.exists()  # refused before a run directory was made


def test_doctor_lists_the_unpriced_models(capsys: pytest.CaptureFixture[str]) -> None:
    Path(os.environ["KERNELFORGE_CONFIG"]).write_text(CONFIG)
    assert [c.name for c in llm_checks(team())] == ["llm"]  # no model configured: nothing to price
    main(["doctor", "--json"])
    found = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    pricing = found["pricing"]
    assert not pricing["ok"] and pricing["problem"] == "unpriced"
    assert "local (my-finetune)" in pricing["detail"] and "writer" not in pricing["detail"]
    assert '"my-finetune" = { input = 0.0, output = 0.0 }' in pricing["fix"]
