"""The agent team end to end, as a user runs it: `kernelforge optimize --proposer agents` (and `hybrid`) in a real
subprocess, configured by a TOML file, talking HTTP to a loopback server that speaks the Anthropic protocol and
replays each role's scripted replies; real nvcc builds, the GPU stages simulated. The run's calls add up to its
cost exactly, the team's kernels reach the tree (a first kernel per pooled model, a planned and judged one, a
debugger's repair of a kernel that did not compile), and `kernelforge runs --models` compares the two models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelforge_tui.config import DEFAULT_PRICES
from kernelforge_tui.store import RunStore
from tests.support.fakes.agent_replies import CARD_DIR, KERNEL, PLAN, Script, kernel, strategy, text_of, verdict
from tests.support.fakes.llm_server import LlmServer

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-ant-e2e-NEVER-SHOWN-42"
WRITER, JUDGE = "claude-sonnet-4-5", "claude-haiku-4-5"
"""Model ids the default pricing table knows: the test checks the costs against it."""
BROKEN = KERNEL.replace("softmax_block_row_bf16(const", "softmax_block_row_bf16(int int const")
assert BROKEN != KERNEL


def plan(block: int) -> dict[str, object]:
    return PLAN | {"block": [block]}


def config(url: str) -> str:
    return f"""
[[llm.providers]]
name = "loop"
protocol = "anthropic"
base_url = "{url}"
api_key_env = "KF_E2E_KEY"
retries = {{ max_attempts = 1 }}

[[llm.models]]
name = "writer"
provider = "loop"
model = "{WRITER}"
max_tokens = 4096
extra = {{ temperature = 0.2 }}

[[llm.models]]
name = "judge"
provider = "loop"
model = "{JUDGE}"

[llm.roles]
planner = "writer"
coder = ["writer", "judge"]
debugger = "writer"
judge = "judge"

[llm.agents]
pool_size = 2
expansions = 2
"""


def replies(proposer: str) -> Script:
    """With the agents alone both first kernels fail to build, so the root is the only node the search can expand
    and it does so only once a result came back: its expansion always sees a failed child (the debugger's turn),
    however slowly a loaded machine builds. (With one good first kernel, expanding that one instead could spend
    the budget before the broken kernel's build failed.)"""
    first_source = BROKEN if proposer == "agents" else KERNEL
    return Script(
        {
            "first@" + WRITER: [kernel("One block per row.", source=first_source, plan=plan(128))],
            "first@" + JUDGE: [kernel("Rows in registers.", source=BROKEN, plan=plan(256))],
            "planner": [strategy(f"Block of {b} threads") for b in (512, 1024, 64, 32, 96, 160)],
            "coder": [kernel(f"Block {b}.", plan=plan(b)) for b in (512, 1024, 64, 32, 96, 160)],
            "judge": [verdict(0.8, "addresses the reads")] * 6,
            "debugger": [kernel("Removed the stray `int int`.", plan=plan(b)) for b in (256, 128, 192, 320)],
        }
    )


def kernelforge(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernelforge_tui.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=os.environ | {"COLUMNS": "200"} | env)  # fmt: skip


@pytest.mark.parametrize("proposer", ["agents", "hybrid"])
def test_optimize_with_the_agent_team_end_to_end(tmp_path: Path, proposer: str) -> None:
    script = replies(proposer)
    with LlmServer(responder=script) as server:
        (tmp_path / "config.toml").write_text(config(server.url))
        env = {"KERNELFORGE_CONFIG": str(tmp_path / "config.toml"), "KF_E2E_KEY": KEY}
        root = tmp_path / "runs"
        budget = "6" if proposer == "agents" else "13"  # hybrid: the templates' 7 seeds come first
        out = kernelforge("optimize", str(CARD_DIR), "--proposer", proposer, "--simulate", "--budget-iters", budget,
                          "--root", str(root), "--json", env=env)  # fmt: skip
        assert out.returncode == 0, out.stderr + out.stdout
        info = json.loads(out.stdout)
        assert info["state"] == "finished" and "iteration budget" in info["reason"]
        models = kernelforge("runs", "--root", str(root), "--models", "--json", env=env)
    assert all(seen.headers["x-api-key"] == KEY for _, seen in script.seen)
    assert all(seen.body["temperature"] == 0.2 for _, seen in script.seen if seen.body["model"] == WRITER)
    with RunStore.open(Path(info["run_dir"]), readonly=True) as store:
        calls = store.llm_calls()
        nodes = store.nodes()
        records = {n.id: store.node_record(n.id) for n in nodes}
        totals = store.llm_totals()
    # costs: every call is priced from the default table, and the calls add up to the run's total exactly
    for call in calls:
        price = DEFAULT_PRICES[call.model]
        assert call.cost_nanousd == call.input_tokens * round(price.input * 1000) + call.output_tokens * round(
            price.output * 1000
        )
    assert totals.cost_nanousd == sum(c.cost_nanousd for c in calls) > 0
    assert totals.tokens == sum(c.input_tokens + c.output_tokens for c in calls) and totals.calls == len(calls)
    roles = {c.role for c in calls}
    assert {"coder", "planner", "judge"} <= roles
    team = [n for n in nodes if n.proposer.startswith("agents:")]
    assert {n.proposer for n in team} == {"agents:writer", "agents:judge"}  # both pooled models wrote a first kernel
    broken = [n for n in team if n.failure == "compile"]
    assert broken, "the kernel with `int int` failed to build for real"
    if proposer == "agents":  # (hybrid's budget goes to the template side first: the root is not expanded again)
        assert "debugger" in roles
        repairs = [records[n.id] for n in team if records[n.id].repair_of is not None]
        assert repairs and all(r.repair_of in {b.id for b in broken} for r in repairs)
        assert any(r.status == "timed" for r in repairs)  # the debugger's fix built and was measured
        line = next(n for n, text in enumerate(BROKEN.splitlines(), start=1) if "int int" in text)
        for asked in script.asked("debugger"):  # nvcc's own message on the line, and the source numbered
            text = text_of(asked)
            assert f"candidate.cu:{line}:79: error: invalid combination of type specifiers" in text
            assert f"{line} | {BROKEN.splitlines()[line - 1]}" in text
    judged = [r for r in records.values() if r.judge_score is not None]
    assert judged and all(r.judge_score == 0.8 for r in judged)
    assert all(r.reward is None or r.reward.term("judge") is not None for r in judged)
    for node in team:  # every team kernel knows the calls that wrote it
        assert any(c.child_id == node.id for c in calls)
    if proposer == "hybrid":
        assert any(n.proposer == "templates" for n in nodes)
    assert models.returncode == 0, models.stderr
    rows = json.loads(models.stdout)
    assert {(r["provider"], r["model"]) for r in rows} == {("loop", WRITER), ("loop", JUDGE)}
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(totals.cost_usd, rel=1e-12)
    assert sum(r["calls"] for r in rows) == len(calls)
    for path in Path(info["run_dir"]).iterdir():
        assert KEY.encode() not in path.read_bytes()
    assert KEY not in out.stdout + out.stderr + models.stdout + models.stderr
