"""The header line: state, best speedup, card, budget (with the LLM cost and token meters), rate, GPU (or the
cluster: its GPUs and throughput), run."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from kernelforge_tui.engine.feedback import NOTHING_TO_PROPOSE
from kernelforge_tui.engine.view import RunHeader, Spend
from kernelforge_tui.vocabulary.events import BudgetUsed

NEAR_CAP = 0.8
"""From this share of a cap on, its meter turns to the warning colour."""
STATE_GLYPH = {"starting": "◌", "running": "▶", "paused": "⏸", "stopping": "■", "finished": "✓"}


def _minutes(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class RunHeaderBar(Static):
    """One line, most important first, cropped on the right in a narrow terminal."""

    DEFAULT_CSS = """
    RunHeaderBar { height: 1; width: 100%; background: $panel; color: $foreground; padding: 0 1; }
    RunHeaderBar > .run-header--running { color: $success; text-style: bold; }
    RunHeaderBar > .run-header--paused { color: $warning; text-style: bold; }
    RunHeaderBar > .run-header--stopped { color: $text-muted; text-style: bold; }
    RunHeaderBar > .run-header--best { color: $success; text-style: bold; }
    RunHeaderBar > .run-header--muted { color: $text-muted; }
    RunHeaderBar > .run-header--near-cap { color: $warning; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "run-header--running",
        "run-header--paused",
        "run-header--stopped",
        "run-header--best",
        "run-header--muted",
        "run-header--near-cap",
    }

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"run-header--{name}", partial=True)

    def show(
        self,
        header: RunHeader,
        budget: BudgetUsed | None,
        nodes: int,
        failures: int,
        note: str = "",
        spend: Spend | None = None,
        cluster: str = "",
    ) -> None:
        # One line, full width: its size never changes, so no layout (a layout reflows the whole screen).
        self.update(self.render_header(header, budget, nodes, failures, note, spend, cluster), layout=False)

    def _meter(self, text: Text, shown: str, used: float, cap: float | None) -> None:
        """A meter in the muted colour, in the warning colour from NEAR_CAP of its cap on."""
        near = cap is not None and cap > 0 and used >= NEAR_CAP * cap
        text.append(f"  {shown}", self._style("near-cap" if near else "muted"))

    def render_header(
        self,
        header: RunHeader,
        budget: BudgetUsed | None,
        nodes: int,
        failures: int,
        note: str = "",
        spend: Spend | None = None,
        cluster: str = "",
    ) -> Text:
        """`cluster`: where a search on a cluster measures now (`cluster_text`), said in place of the GPU's name."""
        muted = self._style("muted")
        kind = {"running": "running", "paused": "paused"}.get(header.state, "stopped")
        text = Text(no_wrap=True, overflow="crop", end="")
        text.append(f"{STATE_GLYPH.get(header.state, '?')} {note or header.state}", self._style(kind))
        if header.nothing_to_propose:  # a card no template serves: said where the eye goes, the log says why
            text.append(f"  {NOTHING_TO_PROPOSE} (the log says why)", self._style("near-cap"))
        text.append("  ")
        text.append(header.card_name or "(card)", "bold")
        if header.best_speedup is not None:
            text.append("  best ", muted)
            text.append(f"{header.best_speedup:.2f}x", self._style("best"))
            if header.best_node_id is not None:
                text.append(f" #{header.best_node_id}", muted)
        text.append(f"  {nodes} nodes", muted)
        if failures:
            text.append(f" ({failures} failed)", muted)
        if budget is not None:
            iters = f"{budget.iterations}" + (f"/{budget.max_iterations}" if budget.max_iterations else "")
            text.append(f"  iter {iters}", muted)
            elapsed = _minutes(budget.elapsed_s) + (f"/{_minutes(budget.max_seconds)}" if budget.max_seconds else "")
            text.append(f"  {elapsed}", muted)
            if budget.max_gpu_seconds:
                text.append(f"  gpu {budget.gpu_seconds:.0f}/{budget.max_gpu_seconds:.0f}s", muted)
        elif header.started_at is not None and header.ended_at is not None:
            text.append(f"  {_minutes(header.ended_at - header.started_at)}", muted)
        if spend is not None and spend.shown:
            self._meter(text, spend.money_text(), spend.money_usd, spend.max_money_usd)
            self._meter(text, spend.tokens_text(), spend.tokens, spend.max_tokens)
        if budget is not None:
            text.append(f"  {budget.candidates_per_minute:.1f}/min", muted)
        where = cluster or header.gpu_name
        if where:
            text.append(f"  {where}", muted)
        if header.backend and header.backend not in where:
            text.append(f" ({header.backend})", muted)
        if header.run_id:
            text.append(f"  run {header.run_id}", muted)
        return text
