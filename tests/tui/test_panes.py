"""What the panes say to a newcomer: every number in the metrics pane with words for what it is, the reward's
explanation and terms for the selected node; the progress chart (`v`); the export key (`m`) writing the selected
node's kernel to take away."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.message import Message
from textual.notifications import Notify

from kernelforge_tui.engine.takeaway import KERNEL_FILE, PLAN_FILE, SUMMARY_FILE
from kernelforge_tui.engine.view import RunView
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.screens import ChartScreen, ExportScreen
from kernelforge_tui.tui.widgets import LogPane
from kernelforge_tui.tui.widgets.chart import ProgressChart, column_rows, progress_of, resample
from kernelforge_tui.vocabulary.commands import MarkExport
from kernelforge_tui.vocabulary.events import StateChanged
from tests.support.fakes.synthetic import SyntheticSource
from tests.support.fakes.tui import metrics_text, screen_text, settle


def make_app(source: SyntheticSource, **settings: object) -> KernelForgeApp:
    return KernelForgeApp(source, TuiSettings(**settings))  # type: ignore[arg-type]


def notes_of(notes: list[str]) -> Callable[[Message], None]:
    def hook(message: Message) -> None:
        if isinstance(message, Notify):
            notes.append(f"{message.notification.title}: {message.notification.message}")

    return hook


# -- metrics -------------------------------------------------------------------------------------


async def test_every_number_in_the_metrics_pane_says_what_it_is() -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        best = source.best
        assert best is not None and app.selected == best.id
        text = metrics_text(app)
        for words in (
            f"child of #{best.parent_id}",
            "proposed by templates",
            f"vs #{best.parent_id}",  # the column of changes against the parent, named
            f"{best.speedup:.2f}x as fast as the baseline (412.00 us)",
            "of the measured ceiling",
            "us a call (median)",
            "(10th-90th percentile)",
            "timed · variation",
            "per thread",
            "per block",
            "to slow local memory",
            "the search's score of it",
            f"{best.visits} candidates tried under it, mean reward {best.value:+.3f}",
        ):
            assert words in text, words
        assert "value " not in text and "visits" not in text  # the old, unexplained words are gone


async def test_the_selected_nodes_reward_is_explained_with_its_terms() -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        assert app.selected is not None
        reward = source.reward(app.selected)
        assert reward is not None
        text = metrics_text(app)
        assert f"reward     {reward.total:+.3f} the search's score of it" in text
        assert f"why: {reward.explanation}" in text and "the parent's speed" in reward.explanation
        for term in reward.terms:
            assert f"{term.name} {term.value:+.3f} {term.explanation}" in text
        profiled = next(n.id for n in source.nodes.values() if n.status == "profiled")
        app.selected = profiled
        await settle(app, pilot)
        text = metrics_text(app)
        assert "dram_bytes +0.120 DRAM bytes -11%" in text and "memory-bound at" in text
        failed = next(n for n in source.nodes.values() if n.status == "failed")
        app.selected = failed.id
        await settle(app, pilot)
        assert f"failure -1.000 {failed.failure}: " in metrics_text(app)


# -- chart ---------------------------------------------------------------------------------------


def test_progress_keeps_the_best_so_far_over_finished_candidates() -> None:
    source = SyntheticSource(60)
    source.grow(0)
    view = RunView.from_snapshot(source.snapshot())
    progress = progress_of(view)
    assert len(progress) == len([n for n in source.nodes.values() if n.status not in ("proposed", "built")])
    speedups = [s for s in progress.best_speedup if s is not None]
    assert speedups == sorted(speedups)  # a best so far never falls
    fastest = max(n.speedup or 0 for n in source.nodes.values() if n.status != "failed")
    assert speedups[-1] == fastest and progress.node_ids == sorted(progress.node_ids)


def test_columns_resample_and_draw_eighths() -> None:
    assert resample([1.0, 2.0, 3.0, 4.0], 2) == [2.0, 4.0]  # each column ends its share of the candidates
    assert resample([1.0, 2.0], 4) == [1.0, 1.0, 2.0, 2.0]
    rows = column_rows([0.0, 0.5, 1.0, None], height=2, top=1.0)
    assert rows == ["  █ ", " ██ "]
    assert column_rows([0.25], height=1, top=1.0) == ["▂"]
    assert column_rows([1.5], height=1, top=2.0, floor=1.0) == ["▄"]


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
async def test_v_charts_the_run_and_follows_it_live(size: tuple[int, int]) -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("v")
        await settle(app, pilot)
        assert isinstance(app.screen, ChartScreen)
        best = source.best
        assert best is not None
        text = screen_text(app)
        finished = len(progress_of(app.state))
        assert f"fastest so far, x the baseline: {best.speedup:.2f}x after {finished} candidates" in text
        assert "best share of the ceiling so far" in text and "█" in text
        chart = app.screen.query_one("#chart-speedup", ProgressChart)
        before = len(chart.progress)
        source.grow(10)
        await app.pump()
        await settle(app, pilot)
        assert len(chart.progress) == before + 10  # drawn again as the run grows
        await pilot.press("v")  # the same key closes it
        await settle(app, pilot)
        assert not isinstance(app.screen, ChartScreen)


async def test_the_chart_key_is_remappable() -> None:
    app = make_app(SyntheticSource(20), keymap={"chart": "ctrl+g"})
    async with app.run_test() as pilot:
        await settle(app, pilot)
        await pilot.press("v")
        await settle(app, pilot)
        assert not isinstance(app.screen, ChartScreen)
        await pilot.press("ctrl+g")
        await settle(app, pilot)
        assert isinstance(app.screen, ChartScreen)
        await pilot.press("ctrl+g")
        await settle(app, pilot)
        assert not isinstance(app.screen, ChartScreen)


# -- export --------------------------------------------------------------------------------------


async def test_m_writes_the_selected_kernel_beside_the_run_and_says_where(tmp_path: Path) -> None:
    source = SyntheticSource(30, run_dir=tmp_path / "runs" / "r-2311-softmax")
    app = make_app(source)
    notes: list[str] = []
    async with app.run_test(size=(120, 40), message_hook=notes_of(notes)) as pilot:
        await settle(app, pilot)
        node = app.selected
        assert node is not None
        await pilot.press("m")
        await settle(app, pilot)
        assert isinstance(app.screen, ExportScreen)
        expected = tmp_path / "runs" / "kernels" / f"r-2311-softmax-node-{node}"
        assert app.screen.query_one("#export-dir").value == str(expected)  # type: ignore[attr-defined]
        await pilot.press("enter")
        await settle(app, pilot)
        await app.pump()
        await settle(app, pilot)
        assert source.written == [expected]
        assert (expected / KERNEL_FILE).read_text() == source.sources[node]
        assert (expected / PLAN_FILE).exists() and (expected / SUMMARY_FILE).exists()
        assert f"#{node} exported: {expected}" in notes  # the toast
        log = [line.plain for line in app.query_one(LogPane)._lines]
        assert any(f"#{node} exported to {expected}" in line for line in log)  # and the log
        marks = [c for c in source.sent if isinstance(c, MarkExport)]
        assert marks == [MarkExport(node_id=node, export=True, at=marks[0].at)]  # ★: what `kernelforge export` packs


async def test_export_into_another_folder_and_from_a_finished_run(tmp_path: Path) -> None:
    source = SyntheticSource(20, steerable=False, state="finished", run_dir=tmp_path / "run")
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert app.check_action("export_kernel", ()) is True  # taking a kernel away needs no live search
        await pilot.press("m")
        await settle(app, pilot)
        field = app.screen.query_one("#export-dir")
        field.value = str(tmp_path / "mine")  # type: ignore[attr-defined]
        await pilot.press("enter")
        await settle(app, pilot)
        assert source.written == [tmp_path / "mine"] and (tmp_path / "mine" / KERNEL_FILE).exists()
        assert source.sent == []  # nothing to mark in a finished run


async def test_an_export_that_cannot_be_written_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    source = SyntheticSource(20, run_dir=tmp_path / "run")
    app = make_app(source)
    notes: list[str] = []
    async with app.run_test(size=(120, 40), message_hook=notes_of(notes)) as pilot:
        await settle(app, pilot)
        await pilot.press("m")
        await settle(app, pilot)
        app.screen.query_one("#export-dir").value = str(blocker / "sub")  # type: ignore[attr-defined]
        await pilot.press("enter")
        await settle(app, pilot)
        assert source.written == [] and source.sent == []
        assert any("not exported: cannot write the kernel into" in n for n in notes)


async def test_escape_cancels_an_export(tmp_path: Path) -> None:
    source = SyntheticSource(20, run_dir=tmp_path / "run")
    app = make_app(source)
    async with app.run_test() as pilot:
        await settle(app, pilot)
        await pilot.press("m", "escape")
        await settle(app, pilot)
        assert source.written == [] and not (tmp_path / "kernels").exists()
        source.pending.append(StateChanged(state="finished"))
        await app.pump()
        assert app.check_action("export_kernel", ()) is True
