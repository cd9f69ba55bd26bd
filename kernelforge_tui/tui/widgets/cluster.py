"""Where a run measures: a cluster's workers as its coordinator sees them now, or the GPUs that measured the run's
evaluations as its store counts them. For the cluster screen (`C`)."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from kernelforge_tui.vocabulary.runs import ClusterStatus


def cluster_text(status: ClusterStatus) -> str:
    """The cluster in a few words, for the header and the screen's title: `cluster · 4 GPUs · 37.0 eval/min`."""
    gpus = status.gpus
    return f"cluster · {gpus} GPU{'s' * (gpus != 1)} · {status.evaluations_per_minute:.1f} eval/min"


class WorkerList(Static):
    """One row a worker: its address and host, its GPUs, what they are on now (`card #node`, or why they are set
    aside), evaluations done."""

    DEFAULT_CSS = """
    WorkerList { height: auto; }
    WorkerList > .worker-list--label { color: $text-muted; }
    WorkerList > .worker-list--busy { color: $success; text-style: bold; }
    WorkerList > .worker-list--set-aside { color: $error; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"worker-list--label", "worker-list--busy", "worker-list--set-aside"}

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"worker-list--{name}", partial=True)

    def show(self, status: ClusterStatus) -> None:
        self.update(self.render_workers(status))

    def render_workers(self, status: ClusterStatus) -> Table | Text:
        label = self._style("label")
        if not status.workers:
            return Text(f"No worker is connected to the scheduler at {status.address} now.", style=label)
        table = Table(box=None, padding=(0, 1), expand=True, header_style=label, show_footer=len(status.workers) > 1)
        table.add_column("worker", footer=Text("all", style=label), overflow="fold")
        table.add_column("host", overflow="fold")
        table.add_column("GPUs", footer=str(status.gpus), justify="right")
        table.add_column("running now", ratio=1, overflow="fold")
        table.add_column("evaluations", footer=str(sum(w.evaluations for w in status.workers)), justify="right")
        for worker in status.workers:
            if worker.set_aside is not None:
                running = Text(f"set aside: {worker.set_aside}", style=self._style("set-aside"))
            elif worker.running:
                running = Text(", ".join(worker.running), style=self._style("busy"))
            else:
                running = Text("idle" if worker.gpus else "builds only (no GPU)", style=label)
            table.add_row(worker.address, worker.host, str(worker.gpus), running, str(worker.evaluations))
        return table


class GpuCounts(Static):
    """The evaluations each GPU measured, from the run's store, busiest first, under a line saying why these and
    not the workers."""

    DEFAULT_CSS = """
    GpuCounts { height: auto; }
    GpuCounts > .gpu-counts--label { color: $text-muted; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"gpu-counts--label"}

    def show(self, counts: dict[str, int], note: str) -> None:
        self.update(self.render_counts(counts, note))

    def render_counts(self, counts: dict[str, int], note: str) -> Group:
        label = self.get_component_rich_style("gpu-counts--label", partial=True)
        if not counts:
            return Group(Text(note, style=label), Text("No evaluation of this run records which GPU measured it."))
        table = Table(box=None, padding=(0, 1), expand=True, header_style=label)
        table.add_column("measured on", ratio=1, overflow="fold")
        table.add_column("evaluations", justify="right")
        for gpu, count in counts.items():
            table.add_row(gpu, str(count))
        return Group(Text(note, style=label), Text(""), table)
