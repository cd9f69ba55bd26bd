"""A key the provider refuses stops the whole run at the first 401 or 403 (issue 30): the search records why and
raises FatalLlmError, whose fix names the variable, and `kernelforge optimize` exits 2 with it, instead of finishing
"finished" with exit 0 after failed expansions that each paid for their planner calls. Against the loopback server,
the real search and the real command line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelforge_tui.cli.main import main
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.errors import BadInput
from kernelforge_tui.llm import FatalLlmError
from tests.engine.test_search_llm import KEY, kernel_reply, llm_settings, make_search
from tests.support.fakes.agent_replies import CARD_DIR, Script, strategy
from tests.support.fakes.llm_server import LlmServer, Reply


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LlmServer]:
    monkeypatch.setenv("KF_TEST_KEY", KEY)
    with LlmServer() as running:
        yield running


@pytest.mark.parametrize("status", [401, 403])
async def test_the_first_refused_key_stops_the_search(tmp_path: Path, server: LlmServer, status: int) -> None:
    server.script(kernel_reply(128, 1), Reply(status=status, error="invalid x-api-key"))
    server.script(*(kernel_reply(b, 2) for b in (64, 256, 512)))  # what a search that went on would get
    search, _ = make_search(tmp_path, llm_settings(server.url, attempts=3), Budget(max_iterations=5))
    with pytest.raises(FatalLlmError) as stopped:
        await search.run()
    assert isinstance(stopped.value, BadInput) and stopped.value.exit_code == 2
    assert "check the key in KF_TEST_KEY" in str(stopped.value) and f"HTTP {status}" in str(stopped.value)
    assert len(server.requests) == 2  # not retried, and no call after it
    info = search.store.run_info()
    assert info.state == "finished" and "cannot be used" in info.reason and "KF_TEST_KEY" in info.reason
    assert [c.outcome for c in search.store.llm_calls()] == ["ok", "error"]
    search.store.close()


async def test_an_unset_key_stops_the_search_before_anything_is_sent(
    tmp_path: Path, server: LlmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KF_TEST_KEY")
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=5))
    with pytest.raises(FatalLlmError, match=r"\$KF_TEST_KEY is not set.*Fix: set KF_TEST_KEY"):
        await search.run()
    assert server.requests == [] and len(search.store.llm_calls()) == 1
    search.store.close()


CONFIG = """
[[llm.providers]]
name = "good"
protocol = "anthropic"
base_url = "{good}"
api_key_env = "KF_GOOD_KEY"

[[llm.providers]]
name = "bad"
protocol = "openai"
base_url = "{bad}/v1"
api_key_env = "KF_BAD_KEY"

[[llm.models]]
name = "writer"
provider = "bad"
model = "gpt-4.1"

[[llm.models]]
name = "thinker"
provider = "good"
model = "claude-sonnet-4-5"

[llm.roles]
coder = ["writer"]
planner = "thinker"
"""


def test_optimize_with_a_bad_coder_key_exits_2_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's run: the planner's key is good, the coder's is not."""
    planner = Script({"planner": [strategy(f"Plan {i}") for i in range(8)]})
    refusing = LlmServer(responder=lambda seen: Reply(status=401, error="Incorrect API key provided: sk-bad****"))
    with LlmServer(responder=planner) as good, refusing as bad:
        Path(os.environ["KERNELFORGE_CONFIG"]).write_text(CONFIG.format(good=good.url, bad=bad.url))
        monkeypatch.setenv("KF_GOOD_KEY", "sk-good-0123456789")
        monkeypatch.setenv("KF_BAD_KEY", "sk-bad-0123456789")
        root = tmp_path / "runs"
        args = ["optimize", str(CARD_DIR), "--proposer", "agents", "--simulate", "--budget-iters", "6"]
        code = main([*args, "--root", str(root), "--json"])
        failure = json.loads(capsys.readouterr().out)
        coder_calls, planner_calls = len(bad.requests), len(good.requests)
    assert code == 2 and failure["error"] == "bad-input", failure
    assert "check the key in KF_BAD_KEY" in failure["message"] and "HTTP 401" in failure["message"]
    assert coder_calls == 1 and planner_calls <= 1  # stopped at the first 401, not after three failed expansions
