"""`kernelforge doctor` with LLM models configured: each model's provider gets a one-token streamed request from a
real loopback server (tests/support/fakes/llm_server.py), and doctor says what is wrong (unreachable, no key, bad key,
unknown model, no streaming, timeout) in the table and in --json, never showing the key."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelforge_tui.cli import doctor as doctor_module
from kernelforge_tui.cli.main import main
from kernelforge_tui.gpu.detect import GpuInfo
from tests.support.fakes.llm_server import LlmServer, Reply

SECRET = "sk-doctor-0123456789abcdef-SECRET"
KEY_ENV = "KF_DOCTOR_TEST_KEY"
MISSING_ENV = "KF_DOCTOR_TEST_NOT_SET"


@pytest.fixture(autouse=True)
def a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the LLM probes: the machine has a GPU and pycuda, so doctor's exit code is theirs
    (without them doctor exits 3 on any machine: tests/cli/test_doctor.py)."""
    gpu = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-0", capability="9.0", driver="570.124.06", memory_mib=143771)
    monkeypatch.setattr(doctor_module, "detect_gpus", lambda: [gpu])
    monkeypatch.setattr(doctor_module, "pycuda_problem", lambda: None)


@pytest.fixture
def servers() -> Iterator[dict[str, LlmServer]]:
    """One server per behaviour: the probes run at once, so one scripted queue could not say which gets what."""
    names = ("ok", "anthropic_ok", "bad_key", "unknown", "json", "stall")
    running = {name: LlmServer() for name in names}
    for server in running.values():
        server.__enter__()
    running["bad_key"].script(Reply(status=401, error=f"Incorrect API key provided: {SECRET}"))
    running["unknown"].script(Reply(status=404, error="The model `no-such-model` does not exist"))
    running["json"].script(Reply(content_type="application/json"))
    running["stall"].script(Reply(end="stall", stall_s=3.0))
    yield running
    for server in running.values():
        server.__exit__()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def provider(name: str, protocol: str, base_url: str, key_env: str | None = None, idle_s: float = 5.0) -> str:
    key = f'api_key_env = "{key_env}"\n' if key_env else ""
    return (
        f'[[llm.providers]]\nname = "{name}"\nprotocol = "{protocol}"\nbase_url = "{base_url}"\n{key}'
        f"timeouts = {{ connect_s = 2, idle_s = {idle_s}, total_s = 10 }}\n"
    )


def model(name: str, provider_name: str, model_id: str, extra: str = "") -> str:
    return f'[[llm.models]]\nname = "{name}"\nprovider = "{provider_name}"\nmodel = "{model_id}"\n{extra}'


def write_config(*tables: str) -> None:
    Path(os.environ["KERNELFORGE_CONFIG"]).write_text("\n".join(tables))


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["doctor", *args])
    return code, capsys.readouterr().out


def test_no_llm_configured_is_one_line_saying_templates_are_used(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = doctor(capsys, "--json")
    llm = [c for c in json.loads(out) if c["name"].startswith("llm")]
    assert len(llm) == 1 and llm[0]["ok"] and "template proposer" in llm[0]["detail"]
    assert code == 0


def test_each_problem_is_named_with_its_fix_and_the_key_is_never_shown(
    servers: dict[str, LlmServer], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    monkeypatch.delenv(MISSING_ENV, raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    port = closed_port()
    write_config(
        provider("good", "openai", f"{servers['ok'].url}/v1", KEY_ENV),
        provider("claude", "anthropic", servers["anthropic_ok"].url, KEY_ENV),
        provider("badkey", "anthropic", servers["bad_key"].url, KEY_ENV),
        provider("unknown", "openai", f"{servers['unknown'].url}/v1"),
        provider("plain", "openai", f"{servers['json'].url}/v1"),
        provider("slow", "openai", f"{servers['stall'].url}/v1", idle_s=0.3),
        provider("gone", "openai", f"http://127.0.0.1:{port}/v1"),
        provider("nokey", "openai", f"{servers['ok'].url}/v1", MISSING_ENV),
        model("m-good", "good", "gpt-test", 'extra = { reasoning_effort = "high", temperature = 0.2 }\n'),
        model("m-claude", "claude", "claude-test", 'extra = { thinking = { type = "enabled", budget_tokens = 99 } }\n'),
        model("m-badkey", "badkey", "claude-test"),
        model("m-unknown", "unknown", "no-such-model"),
        model("m-plain", "plain", "gpt-test"),
        model("m-slow", "slow", "gpt-test"),
        model("m-gone", "gone", "gpt-test"),
        model("m-nokey", "nokey", "gpt-test"),
    )
    code, out = doctor(capsys, "--json")
    assert SECRET not in out
    checks = {c["name"]: c for c in json.loads(out)}
    assert code == 1  # configured models that cannot answer fail doctor

    assert checks["llm m-good"]["ok"] and "streamed a reply" in checks["llm m-good"]["detail"]
    assert checks["llm m-claude"]["ok"]
    expected = {
        "m-badkey": "bad_key",
        "m-unknown": "unknown_model",
        "m-plain": "no_streaming",
        "m-slow": "timeout",
        "m-gone": "unreachable",
        "m-nokey": "no_key",
    }
    for name, problem in expected.items():
        check = checks[f"llm {name}"]
        assert not check["ok"] and check["problem"] == problem, check
        assert check["fix"], check
    assert KEY_ENV in checks["llm m-badkey"]["fix"]  # names the variable to fix, not the key
    assert MISSING_ENV in checks["llm m-nokey"]["detail"] and MISSING_ENV in checks["llm m-nokey"]["fix"]
    assert "no-such-model" in checks["llm m-unknown"]["detail"]
    assert f"127.0.0.1:{port}" in checks["llm m-gone"]["detail"]

    # what went over the wire: one token, streamed, the key in the header, no extra fields; a missing key sends nothing
    sent = servers["ok"].requests
    assert len(sent) == 1 and sent[0].body["max_tokens"] == 1 and sent[0].body["stream"] is True
    assert "reasoning_effort" not in sent[0].body and sent[0].headers["authorization"] == f"Bearer {SECRET}"
    anthropic = servers["anthropic_ok"].requests[0]
    assert anthropic.path == "/v1/messages" and anthropic.body["max_tokens"] == 1 and "thinking" not in anthropic.body
    assert servers["bad_key"].requests[0].headers["x-api-key"] == SECRET

    servers["bad_key"].script(Reply(status=401, error=f"Incorrect API key provided: {SECRET}"))
    servers["unknown"].script(Reply(status=404, error="The model `no-such-model` does not exist"))
    servers["json"].script(Reply(content_type="application/json"))
    servers["stall"].script(Reply(end="stall", stall_s=3.0))
    code, table = doctor(capsys)
    assert code == 1 and SECRET not in table
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if line.count("│") >= 4}
    for name, problem in expected.items():
        assert problem.replace("_", " ") in rows[f"llm {name}"], rows[f"llm {name}"]
    assert "ok" in rows["llm m-good"]


def test_a_model_with_max_completion_tokens_is_probed_with_one_of_those(
    servers: dict[str, LlmServer], capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(
        provider("good", "openai", f"{servers['ok'].url}/v1"),
        model("o", "good", "o4-mini", "extra = { max_completion_tokens = 4096 }\n"),
    )
    code, out = doctor(capsys, "--json")
    assert code == 0, out
    [sent] = servers["ok"].requests
    assert sent.body["max_completion_tokens"] == 1 and "max_tokens" not in sent.body
    assert "authorization" not in sent.headers  # no key configured: none sent (a local server)


def test_a_base_url_that_is_no_url_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    write_config(
        provider("noscheme", "openai", "localhost:8000/v1"),
        provider("broken", "openai", "http://[::1"),
        model("a", "noscheme", "m"),
        model("b", "broken", "m"),
    )
    code, out = doctor(capsys, "--json")
    checks = {c["name"]: c for c in json.loads(out)}
    assert code == 1
    assert checks["llm a"]["problem"] == "unreachable" and "http://" in checks["llm a"]["detail"]
    assert checks["llm b"]["problem"] == "unreachable" and "base_url" in checks["llm b"]["fix"]
