"""The metrics of the selected node: timing, speedup, share of the ceiling, ptxas, ncu, each against its parent; and
what the agents left on it (the judge's score, the failed node it repairs)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel
from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from kernelforge_tui.engine.takeaway import PEAK_VS_CEILING
from kernelforge_tui.tui.source import AgentFacts, ProfileRead
from kernelforge_tui.vocabulary.evaluation import Evaluation, ceiling_share_text
from kernelforge_tui.vocabulary.nodes import NodeView
from kernelforge_tui.vocabulary.rewards import Reward

BAR_WIDTH = 16
LABEL_WIDTH = 10
COMPACT_WIDTH = 50
"""Below this many columns the pane is compact: narrower bars, each change against the parent after its value."""


def bar(share: float, width: int = BAR_WIDTH) -> str:
    filled = max(0, min(width, round(share * width)))
    return "█" * filled + "░" * (width - filled)


class NodeDetail(BaseModel):
    """Everything the pane shows for one node (and the same for its parent, to compare)."""

    node: NodeView
    evaluation: Evaluation | None = None
    profile: ProfileRead | None = None
    agents: AgentFacts | None = None
    reward: Reward | None = None
    """Every term of the node's reward, and its explanation in words."""
    baseline_name: str = "the card's baseline"


class MetricsPane(VerticalScroll, can_focus=True):
    """A compact table; deltas are green when better, orange when worse."""

    DEFAULT_CSS = """
    MetricsPane { background: $surface; }
    MetricsPane > Static { width: 100%; }
    MetricsPane > .metrics-pane--better { color: $success; }
    MetricsPane > .metrics-pane--worse { color: $warning; }
    MetricsPane > .metrics-pane--label { color: $text-muted; }
    MetricsPane > .metrics-pane--bar { color: $primary; }
    MetricsPane > .metrics-pane--error { color: $error; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "metrics-pane--better",
        "metrics-pane--worse",
        "metrics-pane--label",
        "metrics-pane--bar",
        "metrics-pane--error",
    }

    BORDER_TITLE = "Metrics"
    ALLOW_MAXIMIZE = True  # containers are not maximisable by default; this pane is one of the four

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._body = Static("select a node", id="metrics-body")
        self._current: tuple[NodeDetail, NodeDetail | None] | None = None
        self.simulated = False
        """The run's timings are simulated: its shares are of no measured ceiling, and the pane says so."""

    def compose(self) -> ComposeResult:
        yield self._body

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._redraw())

    def show(self, detail: NodeDetail, parent: NodeDetail | None) -> None:
        self._current = (detail, parent)
        self._redraw()

    def on_resize(self) -> None:
        self._redraw()  # compact or not follows the width

    def _redraw(self) -> None:
        if self._current is not None:
            self._body.update(self.render_detail(*self._current))

    @property
    def bar_width(self) -> int:
        """A bar's cells: narrower in a narrow pane, where the words need the room."""
        return BAR_WIDTH if self.size.width >= COMPACT_WIDTH else BAR_WIDTH // 2

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"metrics-pane--{name}", partial=True)

    def _delta(
        self, value: float | None, before: float | None, lower_is_better: bool, fmt: str, unit: str = ""
    ) -> Text:
        """`+0.31x` / `-12 B` against the parent, in the value's unit; fmt `%` shows the relative change instead."""
        if value is None or before is None or value == before:
            return Text("")
        change = value - before
        better = (change < 0) == lower_is_better
        shown = (f"{change / before:+.0%}" if before else "") if fmt == "%" else format(change, fmt) + unit
        return Text(shown, style=self._style("better" if better else "worse"))

    def render_detail(self, d: NodeDetail, p: NodeDetail | None) -> RenderableType:
        """Every number with words a newcomer reads without the README: what it is, in what unit, against what;
        the right-hand column is the change against the parent."""
        node, ev = d.node, d.evaluation
        pev = p.evaluation if p is not None else None
        label = self._style("label")
        # Narrow, the change against the parent follows its value instead of taking a column of its own.
        compact = 0 < self.size.width < COMPACT_WIDTH
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(style=label, no_wrap=True, width=LABEL_WIDTH)
        table.add_column(overflow="fold", ratio=1)  # wraps: a number's words are never cut
        if not compact:
            table.add_column(no_wrap=True, justify="right")

        def add(name: str, value: RenderableType, change: RenderableType) -> None:
            if not compact:
                table.add_row(name, value, change)
            elif isinstance(value, str | Text) and isinstance(change, str | Text) and str(change):
                table.add_row(name, Text.assemble(value, " (", change, ")"))
            else:
                table.add_row(name, value)

        head = Text(f"#{node.id} {node.status}", style="bold", overflow="fold")
        if node.parent_id is not None:
            head.append(f" · child of #{node.parent_id}", style=label)
        if node.proposer:
            head.append(f" · proposed by {node.proposer}", style=label)
        rows: list[RenderableType] = [head]
        rows_after: list[RenderableType] = []
        if node.mutation:
            rows.append(Text(node.mutation, overflow="ellipsis", no_wrap=True))
        if node.status == "failed":
            rows.append(Text(f"{node.failure or 'failed'}: {node.reason}", style=self._style("error")))
        if p is not None and compact:
            table.add_row("", Text(f"(in brackets: the change vs #{p.node.id})", style=label))
        elif p is not None:
            table.add_row("", "", Text(f"change vs #{p.node.id}", style=label))

        res = ev.result if ev is not None else None
        pres = pev.result if pev is not None else None
        speedup = res.speedup if res is not None and res.speedup is not None else node.speedup
        if speedup is not None:
            parent_speedup = p.node.speedup if p is not None else None
            base = f" ({res.baseline.median_us:.2f} us)" if res is not None and res.baseline is not None else ""
            add(
                "speedup",
                Text.assemble((f"{speedup:.2f}x", "bold"), (f" as fast as the baseline{base}", label)),
                self._delta(speedup, parent_speedup, False, "+.2f", "x"),
            )
            bounds = res.speedup_interval if res is not None and res.speedup_interval else node.speedup_interval
            if bounds is not None:
                add("", Text(f"95% sure: {bounds[0]:.2f}x to {bounds[1]:.2f}x", style=label), "")
        share = ev.ceiling_share if ev is not None and ev.ceiling_share is not None else node.ceiling_share
        if share is not None:
            parent_share = (pev.ceiling_share if pev is not None else None) or (p.node.ceiling_share if p else None)
            add(
                "ceiling",
                Text.assemble(
                    (bar(share, self.bar_width), self._style("bar")),
                    " ",
                    (ceiling_share_text(share, self.simulated), label),
                ),
                self._delta(share * 100, None if parent_share is None else parent_share * 100, False, "+.0f", " pts"),
            )
        cand = res.candidate if res is not None else None
        pcand = pres.candidate if pres is not None else None
        if cand is not None:
            before = pcand.median_us if pcand else (p.node.latency_us if p else None)
            add(
                "time",
                Text.assemble(f"{cand.median_us:.2f} us", (" a call (median)", label)),
                self._delta(cand.median_us, before, True, "%"),
            )
            add(
                "spread",
                Text.assemble(f"{cand.p10_us:.2f}-{cand.p90_us:.2f} us", (" (10th-90th percentile)", label)),
                "",
            )
            add(
                "runs",
                Text.assemble(f"{cand.reps}", (" timed · variation ", label), f"{cand.cv:.1%}", (" (cv)", label)),
                "",
            )
        elif node.latency_us is not None:
            before = p.node.latency_us if p is not None else None
            add(
                "time",
                Text.assemble(f"{node.latency_us:.2f} us", (" a call (median)", label)),
                self._delta(node.latency_us, before, True, "%"),
            )
        if ev is not None and ev.build is not None and ev.build.ptxas:
            pstats = pev.build.ptxas if pev is not None and pev.build is not None else {}
            for name, stats in ev.build.ptxas.items():
                prev = pstats.get(name) or (next(iter(pstats.values())) if len(pstats) == 1 else None)
                if len(ev.build.ptxas) > 1:
                    add("kernel", name, "")
                add(
                    "registers",
                    Text.assemble(str(stats.registers), (" per thread", label)),
                    self._delta(stats.registers, prev.registers if prev else None, True, "+d", " regs"),
                )
                add(
                    "shared mem",
                    Text.assemble(f"{stats.shared_bytes} B", (" per block", label)),
                    self._delta(stats.shared_bytes, prev.shared_bytes if prev else None, True, "+d", " B"),
                )
                spills = stats.spill_store_bytes + stats.spill_load_bytes
                pspills = prev.spill_store_bytes + prev.spill_load_bytes if prev else None
                add(
                    "spills",
                    Text.assemble(f"{spills} B", (" to slow local memory", label)),
                    self._delta(spills, pspills, True, "+d", " B"),
                )
        if d.profile is not None and d.profile.profile is None:
            add("profile", Text(f"unreadable: {d.profile.error}", style=self._style("error")), "")
        elif d.profile is not None and d.profile.profile is not None:
            hw = d.profile.profile.hardware
            phw = p.profile.profile.hardware if p is not None and p.profile and p.profile.profile else None
            pkeys = {m.label: m.value for m in phw.key_metrics} if phw is not None else {}
            class_delta = Text(f"was {phw.class_name}", style=label) if phw and phw.bottleneck != hw.bottleneck else ""
            add("profile", Text.assemble((hw.class_name, "bold"), (" (Nsight Compute)", label)), class_delta)
            for metric in hw.key_metrics:
                lower_is_better = metric.unit == "bytes" or "per request" in metric.label
                add(
                    "",
                    Text.assemble((f"{metric.label} ", label), metric.value_text()),
                    self._delta(
                        metric.value,
                        pkeys.get(metric.label),
                        lower_is_better,
                        "+.1f" if metric.unit == "percent" else "%",
                        " pts" if metric.unit == "percent" else "",
                    ),
                )
            rows_after.append(Text(hw.summary(), style=label, overflow="fold"))
            if share is not None:
                rows_after.append(Text(PEAK_VS_CEILING[0].upper() + PEAK_VS_CEILING[1:] + ".", style=label))
        facts = d.agents
        if facts is not None and facts.repair_of is not None:
            add("origin", f"repair of #{facts.repair_of}", "")
        if facts is not None and facts.judge_score is not None:
            score = facts.judge_score
            add(
                "judge",
                Text.assemble(
                    (bar(score, self.bar_width), self._style("bar")), f" {score:.2f}", (" the LLM judge's score", label)
                ),
                "",
            )
        reward = d.reward
        if reward is not None:
            add(
                "reward",
                Text.assemble((f"{reward.total:+.3f}", "bold"), (" the search's score of it (why: below)", label)),
                "",
            )
        add(
            "subtree",
            Text.assemble(f"{node.visits}", (" candidates tried under it, mean reward ", label), f"{node.value:+.3f}"),
            "",
        )
        flags = [f for f, on in (("banned", node.banned), ("pinned", node.pinned), ("export", node.export)) if on]
        if flags:
            add("flags", ", ".join(flags), "")
        rows.append(table)
        if reward is not None:
            rows.append(Text.assemble(("why: ", label), reward.explanation, overflow="fold"))
            for term in reward.terms:
                rows.append(
                    Text.assemble((f"  {term.name} {term.value:+.3f} ", label), term.explanation, overflow="fold")
                )
        rows.extend(rows_after)
        return Group(*rows)
