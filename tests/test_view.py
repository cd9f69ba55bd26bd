"""The one event reducer both faces use (engine/view.py): what a batch of events changes, and the CLI's
live view drawn from it."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from kernelforge_tui.cli.runs import render_run
from kernelforge_tui.engine.view import RunHeader, RunView, Snapshot
from kernelforge_tui.models.events import BestImproved, BudgetUsed, LogLine, NodeAdded, NodeChanged, StateChanged
from kernelforge_tui.models.nodes import FailureKind, NodeStatus, NodeView
from kernelforge_tui.models.runs import RunInfo


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
