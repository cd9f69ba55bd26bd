"""The TUI on a cluster (issue 16): the header says where the run measures, and the cluster screen (`C`) lists the
workers (address, host, GPUs, the candidate each is on, evaluations finished) with the throughput in its title,
redrawn while it is open; a run followed from its store shows the evaluations each GPU measured instead. On a fake
source with two workers, on a real store, and once end to end on a real LocalCluster (simulated timings)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.contrast import AA, contrast
from kernelforge_tui.tui.screens import ClusterScreen
from kernelforge_tui.tui.source import LiveSearchSource, StoreSource
from kernelforge_tui.tui.widgets import RunHeaderBar
from kernelforge_tui.vocabulary.runs import ClusterStatus, WorkerStatus
from tests.cli.test_runs_gpus import BOX1, BOX2, new_run
from tests.support.fakes.screens import drawing_of
from tests.support.fakes.synthetic import SyntheticSource
from tests.support.fakes.tui import drawn, screen_text, settle
from tests.tui.test_contrast import hex_color, is_text, on_top

SCHEDULER = "tcp://10.0.0.5:8786"
BUSY = "tcp://10.0.0.5:40123"
IDLE = "tcp://10.0.0.6:40311"


def two_workers(idle_running: list[str] | None = None) -> ClusterStatus:
    return ClusterStatus(
        address=SCHEDULER,
        workers=[
            WorkerStatus(address=BUSY, host="10.0.0.5", gpus=1, running=["softmax #12"], evaluations=31),
            WorkerStatus(address=IDLE, host="10.0.0.6", gpus=1, running=idle_running or [], evaluations=27),
        ],
        evaluations_per_minute=37.0,
    )


class ClusterSource(SyntheticSource):
    """The synthetic run measured on a two-worker cluster, as a search in this process would see it."""

    def __init__(self) -> None:
        super().__init__(40, run_dir=Path("/runs/r-2311-softmax"))
        self.status = two_workers()

    def cluster_status(self) -> ClusterStatus | None:
        return self.status


def dialog_lines(app: KernelForgeApp) -> list[str]:
    """The open dialog's rows as plain text (from the SVG screenshot, each run of text at its column)."""
    box = app.screen.children[0].region
    rows: dict[int, list[str]] = {}
    for run in drawn(app.export_screenshot()):
        if box.y <= run.row < box.bottom and box.x <= run.col < box.right:
            row = rows.setdefault(run.row, [" "] * app.size.width)
            row[run.col : run.col + len(run.text)] = run.text
    return ["".join(rows[r]).rstrip(" │") for r in sorted(rows)]


def line_with(app: KernelForgeApp, text: str) -> str:
    return next(line for line in dialog_lines(app) if text in line)


def make_app(source: Any, theme: str = "dark", **settings: Any) -> KernelForgeApp:
    return KernelForgeApp(source, TuiSettings(theme=theme, **settings))


async def test_the_cluster_screen_lists_the_workers_and_follows_them() -> None:
    source = ClusterSource()
    app = make_app(source, refresh_hz=20)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        assert "cluster · 2 GPUs · 37.0 eval/min" in str(app.query_one(RunHeaderBar).render())
        await pilot.press("C")
        await settle(app, pilot)
        assert isinstance(app.screen, ClusterScreen)
        assert f"cluster · 2 GPUs · 37.0 eval/min · scheduler {SCHEDULER}" in screen_text(app)
        assert line_with(app, BUSY).split() == ["│", BUSY, "10.0.0.5", "1", "softmax", "#12", "31"]
        assert line_with(app, IDLE).split() == ["│", IDLE, "10.0.0.6", "1", "idle", "27"]
        assert line_with(app, " all ").split() == ["│", "all", "2", "58"]  # the GPUs and evaluations of all workers
        source.status = two_workers(idle_running=["softmax #13"])  # the idle worker took a candidate
        for _ in range(100):  # redrawn by the screen's own timer (20 a second here), without a key
            await pilot.pause(0.01)
            if "softmax #13" in screen_text(app):
                break
        assert "softmax #13" in line_with(app, IDLE)
        why = "3 tasks in a row raised there, the last RuntimeError: no GPU"
        source.status = two_workers()
        source.status.workers[1].set_aside = why
        header = "cluster · 1 GPU · 37.0 eval/min"  # its GPU is no longer counted
        footer = ["│", "all", "1", "58"]
        for _ in range(500):  # the screen and the header each redraw on their own timers, and the taller table lays
            await pilot.pause(0.01)  # its footer out after its rows (CI once read the rows before the footer)
            drawn_footer = any(line.split() == footer for line in dialog_lines(app))
            if "set aside" in screen_text(app) and drawn_footer and header in str(app.query_one(RunHeaderBar).render()):
                break
        assert "set aside: 3 tasks in a row" in line_with(app, IDLE)  # the reason folds onto the next line
        assert "RuntimeError: no GPU" in screen_text(app)
        assert line_with(app, " all ").split() == footer
        assert header in str(app.query_one(RunHeaderBar).render())
        await pilot.press("C")  # the key that opened it closes it
        await pilot.pause()
        assert not isinstance(app.screen, ClusterScreen)


async def test_the_cluster_key_can_be_remapped() -> None:
    app = make_app(ClusterSource(), keymap={"cluster": "u"})
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("u")
        await settle(app, pilot)
        assert isinstance(app.screen, ClusterScreen)
        await pilot.press("u")
        await pilot.pause()
        assert not isinstance(app.screen, ClusterScreen)


async def test_a_run_followed_from_its_store_shows_the_evaluations_per_gpu(tmp_path: Path) -> None:
    run_dir = new_run(tmp_path, "on-cluster", [BOX2, BOX1, BOX2, None], gpu_name=f"cluster {SCHEDULER}")
    source = StoreSource.open(run_dir)
    app = make_app(source)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        header = str(app.query_one(RunHeaderBar).render())
        assert f"cluster {SCHEDULER}" in header and "eval/min" not in header  # the recorded name: no live status
        await pilot.press("C")
        await settle(app, pilot)
        text = screen_text(app)
        assert "GPUs that measured this run" in text
        assert "Live worker status is only shown in the process that runs the search" in text
        assert line_with(app, BOX2).split()[-1] == "2" and line_with(app, BOX1).split()[-1] == "1"
        assert dialog_lines(app).index(line_with(app, BOX2)) < dialog_lines(app).index(line_with(app, BOX1))
        assert not app.screen.query_one("#cluster-workers").display
    await source.close()


@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
async def test_every_text_on_the_cluster_screen_reads_at_wcag_aa(theme: str) -> None:
    app = make_app(ClusterSource(), theme=theme)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("C")
        await settle(app, pilot)
        runs = [run for run in on_top(drawing_of(app)) if is_text(run)]
    assert any("softmax #12" in run.text for run in runs) and any("idle" in run.text for run in runs)
    failures = [(r.text.strip(), r.fg, r.bg) for r in runs if contrast(hex_color(r.fg), hex_color(r.bg)) < AA]
    assert not failures


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_cluster_screen_snapshot(snap_compare: Any, size: tuple[int, int]) -> None:
    async def open_cluster(pilot: Pilot[None]) -> None:
        app: Any = pilot.app
        await settle(app, pilot)
        await pilot.press("C")
        await settle(app, pilot)

    assert snap_compare(make_app(ClusterSource()), terminal_size=size, run_before=open_cluster)


async def test_a_search_on_a_local_cluster_shows_its_two_workers(tmp_path: Path) -> None:
    """The search runs under the app, on two worker processes with a fake GPU each (simulated timings)."""
    from tests.engine.cluster.test_cluster import cluster_search, local_cluster
    from tests.engine.test_search import Harness

    with local_cluster(2) as cluster:
        h = Harness(tmp_path)
        search = cluster_search(h, cluster.scheduler_address, Budget(max_iterations=6), eval_seconds=0.5)
        search.pause()  # held until two candidates are built, so that both GPUs start at once
        source = LiveSearchSource(search, h.store)
        app = make_app(source, refresh_hz=20)
        async with app.run_test(size=(120, 36)) as pilot:
            deadline = time.monotonic() + 120
            while sum(n.status == "built" for n in h.store.nodes()) < 2:
                assert time.monotonic() < deadline, "the candidates were not built"
                await pilot.pause(0.1)
            search.resume()
            deadline = time.monotonic() + 120
            while app.state.header.state != "finished":
                assert time.monotonic() < deadline, "the search on the cluster did not finish"
                await pilot.pause(0.2)
            assert "cluster · 2 GPUs · " in str(app.query_one(RunHeaderBar).render())
            await pilot.press("C")
            await settle(app, pilot)
            status = source.cluster_status()
            assert status is not None and status.address == cluster.scheduler_address
            assert len(status.workers) == 2 and status.gpus == 2 and status.evaluations_per_minute > 0
            assert all(w.evaluations > 0 and w.running == [] for w in status.workers)  # both measured; none busy now
            for worker in status.workers:
                assert line_with(app, worker.address).split()[-2:] == ["idle", str(worker.evaluations)]
    measured = source.measured_on()  # the store's labels name the same workers, with the same counts
    assert sorted(measured.values()) == sorted(w.evaluations for w in status.workers)
    assert all(any(w.address in label for label in measured) for w in status.workers)
    h.store.close()
