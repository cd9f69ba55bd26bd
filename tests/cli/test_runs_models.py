"""`kernelforge runs --models`: providers and models compared per card across the runs under a root (calls, kernels
written, success rate, best speedup, cost), and a run's LLM cost in the plain listing, on stores made here with
RunStore and record_llm_call; and the LLM budgets `optimize` and `tui` take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from kernelforge_tui.cards import load_card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cli.main import main
from kernelforge_tui.cli.runs import render_run
from kernelforge_tui.engine.router import past_records
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.engine.view import RunView
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.evaluation import EvalResult, Evaluation, Timing
from kernelforge_tui.vocabulary.events import BudgetUsed
from kernelforge_tui.vocabulary.llm import LlmCall, Role
from kernelforge_tui.vocabulary.nodes import NodeOutcome, NodeStatus
from tests.conftest import EXAMPLES

PLAN = LaunchPlan(entry="k", grid=[1], block=[32], args=[])
SOFTMAX = EXAMPLES / "cards" / "softmax_f32_small"
RMS = EXAMPLES / "cards" / "rms_norm_bf16_small"


def call(provider: str, model: str, role: Role = "coder", cost: int = 0) -> LlmCall:
    return LlmCall(
        role=role,
        provider=provider,
        model=model,
        prompt_sha256="p",
        reply_sha256="r",
        input_tokens=1000,
        output_tokens=200,
        cost_nanousd=cost,
    )


def kernel(store: RunStore, written_by: LlmCall, speedup: float | None) -> None:
    """A node its coder call wrote: measured at `speedup`, or failed (None)."""
    recorded = store.record_llm_call(written_by)
    assert recorded.id is not None
    root = store.nodes()[0].id
    node = store.add_node(root, f"// {speedup}", PLAN, proposer="agents", llm_calls=[recorded.id])
    if speedup is None:
        evaluation = Evaluation(ok=False, failure="compile", reason="error: expected ';'")
        outcome = NodeOutcome(status=NodeStatus.FAILED, failure="compile", reason=evaluation.reason)
    else:
        timing = Timing(median_us=10 / speedup, p10_us=1, p90_us=1, cv=0.0, reps=5)
        evaluation = Evaluation(ok=True, result=EvalResult(ok=True, speedup=speedup, candidate=timing))
        outcome = NodeOutcome(status=NodeStatus.TIMED, latency_us=10 / speedup, speedup=speedup)
    store.finish_node(node.id, evaluation, outcome, {})


def new_run(root: Path, name: str, card: Path, backend: str = "gpu") -> RunStore:
    store = RunStore.create(root / name, load_card(card), backend, "NVIDIA H200", RunSettings())
    store.add_node(None, "// baseline", PLAN, mutation="baseline")
    return store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    with new_run(runs, "soft-1", SOFTMAX) as store:
        kernel(store, call("openai", "gpt-5", cost=3_000_000), 2.5)
        kernel(store, call("openai", "gpt-5", cost=1_000_000), None)
        kernel(store, call("anthropic", "claude-sonnet-4-5", cost=7_000_000), 1.5)
        store.record_llm_call(call("anthropic", "claude-sonnet-4-5", role="judge", cost=500_000))
    with new_run(runs, "soft-2", SOFTMAX) as store:
        kernel(store, call("openai", "gpt-5", cost=2_000_000), 3.25)
        kernel(store, call("anthropic", "claude-sonnet-4-5", cost=4_000_000), 1.25)
        kernel(store, call("anthropic", "claude-sonnet-4-5", cost=4_000_000), 1.75)
    with new_run(runs, "rms-1", RMS) as store:
        kernel(store, call("local", "qwen2.5-coder:32b"), None)
        kernel(store, call("local", "qwen2.5-coder:32b"), 1.1)
    with new_run(runs, "rms-sim", RMS, backend="simulated") as store:
        kernel(store, call("local", "qwen2.5-coder:32b"), 9.0)
    with new_run(runs, "templates-only", RMS):
        pass
    return runs


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["runs", *args])
    return code, capsys.readouterr().out


def test_models_are_compared_per_card_across_runs(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--root", str(root), "--models", "--json")
    assert code == 0
    rows = {(r["card"], r["provider"], r["model"], r["simulated"]): r for r in json.loads(out)}
    gpt = rows[("softmax_f32_small", "openai", "gpt-5", False)]
    assert (gpt["runs"], gpt["calls"], gpt["kernels"], gpt["correct"]) == (2, 3, 3, 2)
    assert gpt["success_rate"] == pytest.approx(2 / 3) and gpt["best_speedup"] == 3.25
    assert gpt["cost_usd"] == pytest.approx(0.006)
    claude = rows[("softmax_f32_small", "anthropic", "claude-sonnet-4-5", False)]
    assert (claude["runs"], claude["calls"], claude["kernels"], claude["correct"]) == (2, 4, 3, 3)  # judge call counted
    assert claude["success_rate"] == 1.0 and claude["best_speedup"] == 1.75
    assert claude["cost_usd"] == pytest.approx(0.0155)
    qwen = rows[("rms_norm_bf16_small", "local", "qwen2.5-coder:32b", False)]
    assert (qwen["kernels"], qwen["correct"], qwen["best_speedup"], qwen["cost_usd"]) == (2, 1, 1.1, 0.0)
    simulated = rows[("rms_norm_bf16_small", "local", "qwen2.5-coder:32b", True)]
    assert simulated["best_speedup"] == 9.0 and simulated["runs"] == 1  # invented speedups kept apart
    assert simulated["kernels"] == 1 and simulated["correct"] is None and simulated["success_rate"] is None
    assert len(rows) == 4
    order = [(r["card"], r["model"]) for r in json.loads(out)]
    assert order.index(("softmax_f32_small", "gpt-5")) < order.index(("softmax_f32_small", "claude-sonnet-4-5"))


def test_models_table_shows_each_card_with_its_models(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out = run(capsys, "--root", str(root), "--models")
    assert code == 0
    assert "softmax_f32_small (softmax): models compared" in out and "rms_norm_bf16_small (rms_norm)" in out
    gpt = next(line for line in out.splitlines() if "gpt-5" in line)
    assert "67%" in gpt and "3.25x" in gpt and "$0.0060" in gpt
    simulated = next(line for line in out.splitlines() if "9x (simulated)" in line)
    assert "100%" not in simulated and simulated.split("│")[6].strip() == "-"  # no kernel proven correct
    assert "simulated runs prove no kernel correct on a GPU" in out


def test_a_models_cost_per_kernel_counts_only_its_kernel_writing_calls(root: Path) -> None:
    with RunStore.open(root / "soft-1", readonly=True) as store:
        claude = next(r for r in store.model_records() if r.model == "claude-sonnet-4-5")
    assert (claude.cost_nanousd, claude.writing_cost_nanousd, claude.kernels) == (7_500_000, 7_000_000, 1)  # judge


def test_the_router_learns_nothing_from_simulated_runs(root: Path) -> None:
    records = past_records("rms_norm", root)
    assert [(r.kernels, r.correct) for r in records] == [(2, 1)]  # rms-1's; rms-sim's 9x is not counted


def test_models_with_no_llm_calls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with new_run(tmp_path / "runs", "plain", SOFTMAX):
        pass
    code, out = run(capsys, "--root", str(tmp_path / "runs"), "--models")
    assert code == 0 and "no LLM calls recorded" in out
    code, out = run(capsys, "--root", str(tmp_path / "runs"), "--models", "--json")
    assert code == 0 and json.loads(out) == []


def test_the_plain_listing_shows_a_runs_llm_cost(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out = run(capsys, "--root", str(root), "--json")
    assert code == 0
    llm = {r["run_id"]: r["llm"] for r in json.loads(out)}
    assert llm["templates-only"] is None
    assert llm["soft-1"]["calls"] == 4 and llm["soft-1"]["cost_usd"] == pytest.approx(0.0115)
    assert llm["soft-1"]["input_tokens"] == 4000 and llm["soft-1"]["output_tokens"] == 800
    monkeypatch.setenv("COLUMNS", "250")
    code, out = run(capsys, "--root", str(root))
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 5}
    assert "$0.0115 (4 calls)" in lines["soft-1"] and "$0.0100 (3 calls)" in lines["soft-2"]
    assert "calls" not in lines["templates-only"]


def test_the_listing_has_no_llm_column_without_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    with new_run(tmp_path / "runs", "plain", SOFTMAX):
        pass
    code, out = run(capsys, "--root", str(tmp_path / "runs"))
    assert code == 0 and "plain" in out and "llm" not in out


CAPS = [("--budget-money", "money budget"), ("--budget-tokens", "token budget")]


@pytest.mark.parametrize(("option", "reason"), CAPS)
def test_llm_budgets_reach_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, reason: str
) -> None:
    """A cap of 0 is reached at once: the search stops cleanly after the baseline, saying which budget."""
    run_dir = tmp_path / "runs" / "capped"
    args = ["optimize", str(SOFTMAX), "--simulate", "--run-dir", str(run_dir), option, "0", "--json"]
    code = main(args)
    info = json.loads(capsys.readouterr().out)
    assert code == 0 and info["state"] == "finished" and reason in info["reason"], info
    with RunStore.open(run_dir, readonly=True) as store:
        assert store.settings(RunSettings).budget.model_dump(exclude_none=True) == {
            "max_money" if option == "--budget-money" else "max_tokens": 0
        }


@pytest.mark.parametrize("command", ["optimize", "tui"])
def test_a_negative_budget_is_bad_input_naming_its_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code = main([command, str(SOFTMAX), "--simulate", "--budget-money", "-1"])
    out = capsys.readouterr().out
    assert code == 2 and "--budget-money -1" in out and "0 or more" in out
    assert not (tmp_path / "runs").exists()


def test_tui_hands_the_proposer_to_the_search_as_optimize_does(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tui", str(SOFTMAX), "--simulate", "--proposer", "agents", "--budget-tokens", "1000"])
    out = capsys.readouterr().out
    assert code == 2 and "--proposer agents needs an LLM" in out and "[[llm.providers]]" in out


def test_the_live_view_shows_llm_spend_against_its_caps(tmp_path: Path) -> None:
    with new_run(tmp_path / "runs", "live", SOFTMAX) as store:
        info = store.run_info()
    view = RunView()
    used = BudgetUsed(iterations=3, elapsed_s=30.0, gpu_seconds=1.0, tokens=5400, max_tokens=100000, money_usd=0.0123)
    view.apply([used.model_copy(update={"max_money_usd": 0.5})])
    console = Console(width=200, record=True)
    console.print(render_run(info, view))
    assert "$0.0123/$0.5, 5400/100000 tokens" in console.export_text()
    view.apply([BudgetUsed(iterations=3, elapsed_s=30.0, gpu_seconds=1.0)])  # templates only: no LLM line
    console = Console(width=200, record=True)
    console.print(render_run(info, view))
    assert "tokens" not in console.export_text()
