"""What the panes' words claim (issue 34): log times of a run at rest, a simulated run's ceiling, and the share of
the ceiling set apart from ncu's % of peak, in the TUI and in `show` alike."""

from __future__ import annotations

import time
from typing import Any

from textual.pilot import Pilot

from kernelforge_tui.engine.backend import SIMULATED
from kernelforge_tui.engine.takeaway import PEAK_VS_CEILING, KernelSummary, render_summary
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.widgets import DiffPane, MetricsPane, SearchTree
from kernelforge_tui.vocabulary.evaluation import ceiling_share_text
from kernelforge_tui.vocabulary.nodes import NodeStatus
from tests.support.fakes.synthetic import T0, SyntheticSource
from tests.support.fakes.tui import screen_text, settle


async def zoomed_metrics(app: KernelForgeApp, pilot: Pilot[None], node_id: int | None = None) -> str:
    """The metrics pane's words, zoomed to the whole screen, on one line."""
    if node_id is not None:
        app.query_one(SearchTree).select_id(node_id)
    await settle(app, pilot)
    app.query_one(MetricsPane).focus()
    await pilot.press("z")
    await settle(app, pilot)
    return " ".join(screen_text(app).replace("│", " ").split())


async def test_an_opened_run_at_rest_logs_times_of_day_not_offsets_from_its_start() -> None:
    app = KernelForgeApp(SyntheticSource(10, state="finished"), TuiSettings())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
        assert time.strftime("%H:%M:%S", time.localtime(T0 + 1)) + " search started" in text
        assert "+0:01" not in text
        assert time.strftime("%Y-%m-%d", time.localtime(T0)) in text  # the day, in the log's title


async def test_a_live_run_logs_times_since_its_start() -> None:
    app = KernelForgeApp(SyntheticSource(10), TuiSettings())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        assert "+0:01 search started" in screen_text(app)


async def test_a_simulated_runs_metrics_claim_no_measured_ceiling() -> None:
    source = SyntheticSource(40)
    source.header = source.header.model_copy(update={"backend": SIMULATED})
    app = KernelForgeApp(source, TuiSettings())
    async with app.run_test(size=(160, 48)) as pilot:
        text = await zoomed_metrics(app, pilot)
        assert "simulated ceiling (no GPU measured it)" in text
        assert "measured ceiling" not in text and "peak" not in text


async def test_a_profiled_node_says_how_the_ceiling_share_differs_from_ncus_peak() -> None:
    app = KernelForgeApp(SyntheticSource(40), TuiSettings())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        profiled = next(n.id for n in app.state.nodes.values() if n.status == "profiled")
        text = await zoomed_metrics(app, pilot, profiled)
        assert "of the measured ceiling" in text and "% of peak" in text
        assert " ".join(PEAK_VS_CEILING.split())[1:] in text


def test_show_words_the_share_through_the_same_function() -> None:
    fields: dict[str, Any] = dict.fromkeys(KernelSummary.model_fields)
    fields |= {"card_name": "c", "family": "elementwise", "card_dir": "k", "node_id": 2, "status": NodeStatus.TIMED}
    fields |= {"best": False, "simulated": False, "checks": [], "ceiling_share": 0.81, "gpu_name": "NVIDIA H200"}
    fields |= {"params": {}, "hints": [], "run_id": "r", "run_dir": "d"}
    text = render_summary(KernelSummary.model_construct(**fields))
    assert ceiling_share_text(0.81, False) in text and PEAK_VS_CEILING in text


async def test_at_80x24_the_tree_has_the_width_and_the_diff_a_useful_height() -> None:
    app = KernelForgeApp(SyntheticSource(40), TuiSettings())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        tree, diff, metrics = app.query_one(SearchTree), app.query_one(DiffPane), app.query_one(MetricsPane)
        assert tree.size.width >= 76 and diff.scrollable_content_region.height >= 9
        best = app.state.nodes[app.state.best_id or 0]
        assert f"#{best.id} timed {best.speedup:.2f}x" in screen_text(app)  # the number and the status in words
        assert metrics.size.width >= 30
        parent = app.state.nodes[best.parent_id or 0]
        assert best.speedup is not None and parent.speedup is not None
        text = screen_text(app)
        assert f"(+{best.speedup - parent.speedup:.2f}x)" in text  # each change after its value, with its unit
