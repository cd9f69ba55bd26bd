"""`M`: the run's providers and models side by side: calls, kernels written, how many were correct, the best
speedup among them, and what they cost. Read from the run's store in a thread worker; the app asks for a new read
when calls end while it is open."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static
from textual.worker import get_current_worker

from kernelforge_tui.engine.view import money_text
from kernelforge_tui.tui.screens.closable import ClosableScreen
from kernelforge_tui.vocabulary.llm import ModelRecord, usd


class ModelsScreen(ClosableScreen):
    DEFAULT_CSS = """
    ModelsScreen { align: center middle; }
    ModelsScreen > VerticalScroll {
        width: 110; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    ModelsScreen > .models-screen--label { color: $text-muted; }
    ModelsScreen > .models-screen--best { color: $success; text-style: bold; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"models-screen--label", "models-screen--best"}
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "Close", id="models_close")]

    class RecordsRead(Message):
        def __init__(self, records: list[ModelRecord]) -> None:
            super().__init__()
            self.records = records

    def __init__(self, read: Callable[[], list[ModelRecord]], simulated: bool = False, close_keys: str = "") -> None:
        super().__init__(close_keys)
        """The keys that opened the screen (the app's, as remapped) close it too."""
        self._read_records = read
        self.simulated = simulated
        """The run's timings are simulated: no kernel was proven correct on a GPU, and the screen counts none."""
        self.records: list[ModelRecord] | None = None
        """As last read; None before the first read lands."""

    def compose(self) -> ComposeResult:
        with VerticalScroll(can_focus=True) as box:
            box.border_title = "Models in this run"
            box.border_subtitle = (
                "simulated run: no kernel is proven correct · esc closes"
                if self.simulated
                else "kernels: coder and debugger replies in the tree · per kernel: those calls' cost · esc closes"
            )
            yield Static("reading the run's calls…", id="models-table")

    def on_mount(self) -> None:
        self.reload()

    def reload(self) -> None:
        self._read()

    @work(thread=True, exclusive=True, group="models", exit_on_error=False)
    def _read(self) -> None:
        records = self._read_records()
        if not get_current_worker().is_cancelled:
            self.post_message(self.RecordsRead(records))

    @on(RecordsRead)
    def _show(self, message: RecordsRead) -> None:
        self.records = message.records
        self.query_one("#models-table", Static).update(self.render_records(message.records))

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"models-screen--{name}", partial=True)

    def render_records(self, records: list[ModelRecord]) -> Table | Text:
        if not records:
            return Text("No LLM calls in this run (its proposer is the template library).", style=self._style("label"))
        label, best_style = self._style("label"), self._style("best")
        bests = [r.best_speedup for r in records if r.best_speedup is not None]
        top = max(bests) if bests else None
        table = Table(box=None, padding=(0, 1), expand=True, header_style=label, show_footer=len(records) > 1)
        calls, kernels, correct = (sum(getattr(r, f) for r in records) for f in ("calls", "kernels", "correct"))
        cost = sum(r.cost_nanousd for r in records)
        writing = sum(r.writing_cost_nanousd for r in records)
        table.add_column("provider/model", footer=Text("all", style=label), ratio=1, overflow="fold")
        table.add_column("calls", footer=str(calls), justify="right")
        table.add_column("kernels", footer=str(kernels), justify="right")
        table.add_column("correct", footer=self._proven(correct), justify="right")
        table.add_column("success", footer=self._rate(correct, kernels), justify="right")
        table.add_column("best", footer=f"{top:.2f}x" if top is not None else "-", justify="right")
        table.add_column("cost", footer=money_text(usd(cost)), justify="right")
        table.add_column("per kernel", footer=_per_kernel(writing, kernels), justify="right")
        for r in records:
            best = Text(f"{r.best_speedup:.2f}x" if r.best_speedup is not None else "-")
            if r.best_speedup is not None and r.best_speedup == top:
                best.stylize(best_style)
            table.add_row(
                f"{r.provider}/{r.model}",
                str(r.calls),
                str(r.kernels),
                self._proven(r.correct),
                self._rate(r.correct, r.kernels),
                best,
                money_text(usd(r.cost_nanousd)),
                _per_kernel(r.writing_cost_nanousd, r.kernels),
            )
        return table

    def _proven(self, correct: int) -> str:
        return "-" if self.simulated else str(correct)

    def _rate(self, correct: int, kernels: int) -> str:
        return f"{correct / kernels:.0%}" if kernels and not self.simulated else "-"


def _per_kernel(cost_nanousd: int, kernels: int) -> str:
    return money_text(usd(cost_nanousd) / kernels) if kernels else "-"
