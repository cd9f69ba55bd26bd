"""`C`: where the run measures. On a cluster the search in this process runs on: the workers, their GPUs, what each
is on now and the evaluations each finished, with the throughput in the title, redrawn a few times a second. Else
(a run followed from its store, or one on this machine's GPUs): the evaluations each GPU measured, as the store
counts them, read in a thread worker and read again every few seconds."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.worker import get_current_worker

from kernelforge_tui.tui.screens.closable import ClosableScreen
from kernelforge_tui.tui.widgets.cluster import GpuCounts, WorkerList, cluster_text
from kernelforge_tui.vocabulary.runs import ClusterStatus

COUNTS_EVERY_S = 2.0
"""How often the store's counts are read again while the screen is open (a query over every measurement)."""
ELSEWHERE = (
    "Live worker status is only shown in the process that runs the search: these are the evaluations each GPU "
    "measured, from the run's store."
)
NOT_ON_A_CLUSTER = "This search does not run on a cluster: these are the evaluations each GPU measured, from its store."


class ClusterScreen(ClosableScreen):
    DEFAULT_CSS = """
    ClusterScreen { align: center middle; }
    ClusterScreen > VerticalScroll {
        width: 120; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "Close", id="cluster_close")]

    class CountsRead(Message):
        def __init__(self, counts: dict[str, int]) -> None:
            super().__init__()
            self.counts = counts

    def __init__(
        self,
        status: Callable[[], ClusterStatus | None],
        counts: Callable[[], dict[str, int]],
        *,
        in_process: bool,
        every_s: float,
        close_keys: str = "",
    ) -> None:
        """`status`: the live cluster (no I/O), asked every `every_s`; `counts`: the store's per-GPU counts
        (blocking), read when there is no live cluster. `in_process`: the search runs here (says why no workers)."""
        super().__init__(close_keys)
        """The keys that opened the screen (the app's, as remapped) close it too."""
        self._status = status
        self._read_counts = counts
        self._in_process = in_process
        self._every_s = every_s

    def compose(self) -> ComposeResult:
        with VerticalScroll(can_focus=True) as box:
            box.border_subtitle = "esc closes"
            yield WorkerList(id="cluster-workers")
            yield GpuCounts("reading the run's store…", id="cluster-gpus")

    def on_mount(self) -> None:
        if self._status() is not None:
            self.query_one(GpuCounts).display = False
            self.refresh_status()
            self.set_interval(self._every_s, self.refresh_status, name="cluster-status")
        else:
            self.query_one(WorkerList).display = False
            self.query_one(VerticalScroll).border_title = "GPUs that measured this run"
            self._read()
            self.set_interval(COUNTS_EVERY_S, self._read, name="cluster-counts")

    def refresh_status(self) -> None:
        """Redraw the workers as the cluster stands now."""
        status = self._status()
        if status is None:
            return
        self.query_one(VerticalScroll).border_title = f"{cluster_text(status)} · scheduler {status.address}"
        self.query_one(WorkerList).show(status)

    @work(thread=True, exclusive=True, group="cluster-counts", exit_on_error=False)
    def _read(self) -> None:
        counts = self._read_counts()
        if not get_current_worker().is_cancelled:
            self.post_message(self.CountsRead(counts))

    @on(CountsRead)
    def _show_counts(self, message: CountsRead) -> None:
        self.query_one(GpuCounts).show(message.counts, NOT_ON_A_CLUSTER if self._in_process else ELSEWHERE)
