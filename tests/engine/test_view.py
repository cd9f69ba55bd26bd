"""The one event reducer both faces use (engine/view.py): what a batch of events changes (LLM calls included:
their streamed text, their totals, a line each in the log), and the CLI's live view drawn from it."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from kernelforge_tui.cli.runs import render_run
from kernelforge_tui.engine.view import CALLS_KEEP, RunHeader, RunView, Snapshot
from kernelforge_tui.vocabulary.events import (
    BestImproved,
    BudgetUsed,
    LlmCallEnded,
    LlmCallStarted,
    LlmText,
    LogLine,
    NodeAdded,
    NodeChanged,
    StateChanged,
)
from kernelforge_tui.vocabulary.llm import LlmCall, LlmTotals
from kernelforge_tui.vocabulary.nodes import FailureKind, NodeStatus, NodeView
from kernelforge_tui.vocabulary.runs import RunInfo


def node(node_id: int, parent: int | None, speedup: float | None = None, **fields: object) -> NodeView:
    status = NodeStatus.TIMED if speedup is not None else NodeStatus.PROPOSED
    return NodeView.model_validate(
        {"id": node_id, "parent_id": parent, "status": status, "speedup": speedup, "created_at": 0.0} | fields
    )


def grown() -> RunView:
    view = RunView()
    view.apply([NodeAdded(node=node(1, None, 1.0)), NodeAdded(node=node(2, 1, 1.5, mutation="block 128 -> 256"))])
    return view


def test_a_batch_says_what_it_added_and_changed_each_id_once() -> None:
    view = grown()
    changes = view.apply(
        [
            NodeAdded(node=node(3, 2)),
            NodeChanged(node=node(3, 2, 2.0)),
            NodeChanged(node=node(1, None, 1.0, visits=4)),
            NodeChanged(node=node(1, None, 1.0, visits=5)),
        ]
    )
    assert changes.added == [3] and changes.changed == [1] and changes.header
    assert view.nodes[1].visits == 5 and view.nodes[3].speedup == 2.0
    assert view.children[2] == [3] and view.root_id == 1


def test_failures_are_counted_and_logged_once_with_their_error() -> None:
    view = grown()
    failed = node(3, 2, status=NodeStatus.FAILED, failure=FailureKind.COMPILE, reason="x.cu(9): error\n  in4.x")
    changes = view.apply([NodeAdded(node=node(3, 2)), NodeChanged(node=failed), NodeChanged(node=failed)])
    assert view.failures == 1
    errors = [line for line in changes.logs if line.level == "error"]
    assert [line.text for line in errors] == ["compile: x.cu(9): error\n  in4.x"] and errors[0].node_id == 3
    view.apply([NodeChanged(node=node(3, 2, 1.2))])  # measured again (a resume): no longer failed
    assert view.failures == 0


def test_a_new_best_moves_the_best_path_and_the_header() -> None:
    view = grown()
    view.apply([NodeAdded(node=node(3, 2, 2.5))])
    assert view.best_id is None  # only the engine's BestImproved names the best
    changes = view.apply([BestImproved(node_id=3, speedup=2.5, latency_us=4.0)])
    assert changes.best_changed and changes.best_before is None
    assert view.best_path() == {1, 2, 3} and view.header.best_speedup == 2.5
    assert changes.logs[-1].text == "new best: 2.50x, 4.00 us"


def test_budget_state_and_the_log_tail() -> None:
    view = grown()
    budget = BudgetUsed(iterations=7, elapsed_s=3.0, gpu_seconds=1.0)
    view.apply([budget, LogLine(text="worker up"), StateChanged(state="finished", reason="iteration budget", at=9.0)])
    assert view.budget == budget and not view.live and view.header.ended_at == 9.0
    assert [line.text for line in view.recent_logs(2)] == ["worker up", "search finished: iteration budget"]
    assert all(line.level != "debug" for line in view.recent_logs(10))  # "templates tried: ..." left out
    assert any(line.level == "debug" for line in view.logs)


def test_a_snapshot_without_a_best_finds_it() -> None:
    view = RunView.from_snapshot(Snapshot(nodes=[node(2, 1, 1.5), node(1, None, 1.0), node(3, 1, 1.5)]))
    assert view.best_id == 2 and view.children[None] == [1] and view.children[1] == [2, 3]


def info(state: str) -> RunInfo:
    fields = {"run_id": "r", "card_name": "c", "family": "f", "gpu_name": "g", "backend": "gpu", "started_at": 0.0}
    return RunInfo(run_dir=Path("/runs/r"), state=state, **fields)


def test_a_run_whose_process_died_is_not_live() -> None:
    assert RunHeader.from_info(info("interrupted")).state == "finished"
    assert RunHeader.from_info(info("paused")).state == "paused"


def test_the_cli_live_view_draws_from_the_same_view() -> None:
    view = grown()
    failed = node(3, 2, status=NodeStatus.FAILED, failure=FailureKind.COMPILE, reason="x.cu(9): error\n  in4.x")
    view.apply(
        [
            BudgetUsed(iterations=7, max_iterations=50, elapsed_s=90.0, gpu_seconds=1.0, candidates_per_minute=4.5),
            NodeChanged(node=failed),
            BestImproved(node_id=2, speedup=1.5, latency_us=4.0),
        ]
    )
    console = Console(width=200, record=True)
    console.print(render_run(info("running"), view))
    text = console.export_text()
    assert "7/50 candidates" in text and "4.5 candidates/min" in text
    assert "#3 compile: x.cu(9): error" in text and "in4.x" not in text  # the first line of the error
    assert "#2 new best: 1.50x, 4.00 us" in text


def llm_call(
    role: str = "coder", outcome: str = "ok", tokens: tuple[int, int] = (1200, 300), **fields: object
) -> LlmCall:
    return LlmCall.model_validate(
        {
            "role": role,
            "provider": "openai",
            "model": "gpt-4.1",
            "prompt_sha256": "p" * 64,
            "reply_sha256": "r" * 64,
            "input_tokens": tokens[0],
            "output_tokens": tokens[1],
            "cost_nanousd": 4_200_000,
            "latency_s": 3.25,
            "outcome": outcome,
            "node_id": 2,
        }
        | fields
    )


def started(key: str, role: str = "coder", node_id: int | None = 2) -> LlmCallStarted:
    return LlmCallStarted(call_key=key, role=role, provider="openai", model="gpt-4.1", node_id=node_id)  # type: ignore[arg-type]


def test_llm_calls_stream_their_text_and_a_retry_starts_it_over() -> None:
    view = grown()
    changes = view.apply(
        [started("a"), LlmText(call_key="a", text="```cuda\n"), LlmText(call_key="a", text="__global")]
    )
    assert changes.calls == ["a"] and changes  # one key, however many pieces
    live = view.calls["a"]
    assert live.text == "```cuda\n__global" and live.pieces == ["```cuda\n", "__global"] and live.attempt == 1
    assert view.writing_call(2) is live and view.writing_call(3) is None and view.writing_call() is live
    view.apply([LlmText(call_key="a", text="", retry=True), LlmText(call_key="a", text="again")])
    assert live.text == "again" and live.attempt == 2 and live.chars == 5
    view.apply([LlmText(call_key="nobody", text="lost")])  # a piece of a call this view never saw start
    assert list(view.calls) == ["a"]


def test_only_kernel_writers_stream_into_the_diff() -> None:
    view = grown()
    view.apply([started("p", role="planner"), started("j", role="judge"), started("d", role="debugger", node_id=3)])
    writing = view.writing_call()
    assert writing is not None and writing.key == "d"  # the latest writer, on any node
    assert view.writing_call(2) is None  # a planner and a judge work on #2, but write no kernel
    assert [c.key for c in view.calls_for(2)] == ["p", "j"]


def test_an_ended_call_moves_the_totals_and_logs_one_line() -> None:
    view = grown()
    call = llm_call()
    totals = LlmTotals(calls=3, input_tokens=5000, output_tokens=900, cost_nanousd=12_500_000)
    changes = view.apply(
        [started("a"), LlmText(call_key="a", text="x"), LlmCallEnded(call_key="a", call=call, totals=totals)]
    )
    assert view.calls == {} and list(view.ended_calls) == [call] and changes.ended_calls == [call]
    assert view.llm_totals == totals and changes.header and changes.calls == ["a"]
    (line,) = changes.logs
    assert line.level == "info" and line.node_id == 2
    assert line.text == "coder openai/gpt-4.1: 1,200 in + 300 out tokens, $0.0042, 3.2 s, ok"
    spend = view.spend()
    assert spend.shown and spend.calls == 3 and spend.tokens == 5900 and spend.money_usd == 0.0125


def test_failed_calls_log_at_warning_level_with_their_error() -> None:
    view = grown()
    bad = llm_call(outcome="malformed", error="no ```cuda block in the reply\nfull reply kept", attempts=2, child_id=7)
    gone = llm_call(role="planner", outcome="error", error="openai: 401 bad key (set OPENAI_API_KEY)")
    cancelled = llm_call(outcome="cancelled", error="cancelled: the search paused or stopped")
    totals = LlmTotals(calls=1)
    changes = view.apply(
        [LlmCallEnded(call_key=k, call=c, totals=totals) for k, c in (("a", bad), ("b", gone), ("c", cancelled))]
    )
    levels = [(line.level, line.node_id) for line in changes.logs]
    assert levels == [("warning", 7), ("warning", 2), ("info", 2)]  # a call that wrote a node names that node
    assert changes.logs[0].text.endswith("2 attempts, malformed: no ```cuda block in the reply")
    assert changes.logs[1].text.endswith("error: openai: 401 bad key (set OPENAI_API_KEY)")


def test_the_ended_calls_kept_are_bounded() -> None:
    view = RunView()
    view.apply([LlmCallEnded(call_key=str(i), call=llm_call(), totals=LlmTotals()) for i in range(CALLS_KEEP + 5)])
    assert len(view.ended_calls) == CALLS_KEEP


def test_a_finished_run_has_no_call_in_flight() -> None:
    """A call whose process died never ends: the run's end drops it (no stream left waiting forever)."""
    view = grown()
    view.apply([started("a")])
    changes = view.apply([StateChanged(state="finished", reason="interrupted")])
    assert view.calls == {} and changes.calls == ["a"]


def test_spend_shows_caps_and_the_later_of_two_running_totals() -> None:
    view = grown()
    assert not view.spend().shown  # no calls, no caps: no meters
    view.apply([BudgetUsed(iterations=1, elapsed_s=1.0, gpu_seconds=0.0, max_money_usd=5.0)])
    spend = view.spend()
    assert spend.shown and spend.money_text() == "$0.00/$5.00" and spend.tokens_text() == "0 tok"
    budget = BudgetUsed(
        iterations=2,
        elapsed_s=2.0,
        gpu_seconds=0.0,
        tokens=123_456,
        max_tokens=2_000_000,
        money_usd=1.5,
        max_money_usd=5,
    )
    view.apply([budget, LlmCallEnded(call_key="a", call=llm_call(), totals=LlmTotals(calls=1, input_tokens=1500))])
    spend = view.spend()
    assert spend.tokens == 123_456 and spend.money_usd == 1.5  # the budget's totals came later than the call's
    assert spend.money_text() == "$1.50/$5.00" and spend.tokens_text() == "123.5k/2.00M tok"


def test_a_snapshot_carries_the_llm_state() -> None:
    call = llm_call()
    snapshot = Snapshot(
        nodes=[node(1, None, 1.0)],
        llm_totals=LlmTotals(calls=4, cost_nanousd=9),
        calls_in_flight=[started("a", node_id=1)],
        ended_calls=[call],
    )
    view = RunView.from_snapshot(snapshot)
    assert view.llm_totals.calls == 4 and list(view.ended_calls) == [call]
    live = view.writing_call(1)
    assert live is not None and live.key == "a" and live.text == ""
    view.apply([LlmText(call_key="a", text="__global__")])
    assert live.text == "__global__"


def test_the_cli_live_view_logs_llm_calls_too() -> None:
    view = grown()
    view.apply([LlmCallEnded(call_key="a", call=llm_call(outcome="error", error="timeout"), totals=LlmTotals())])
    console = Console(width=200, record=True)
    console.print(render_run(info("running"), view))
    assert "#2 coder openai/gpt-4.1: 1,200 in + 300 out tokens" in console.export_text()
