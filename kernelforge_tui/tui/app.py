"""The Kernel Forge TUI: watch a search tree grow, dig into any candidate, steer from the keyboard.

The app knows a run only through a `RunSource` (an in-process search, or a store followed from another
process). Events are folded into the shared `RunView` a few times a second (fewer over SSH) and only what
changed is repainted. What the panes show of the selected node (its evaluation, profile and source) is
read from SQLite in thread workers and posted back, so the UI loop never waits on the store. Every
steering key sends a typed engine command through the source, and is disabled while it cannot act.

With LLM agents, a coder's or debugger's reply streams into the diff's place while it is written for the
selected node (or for any node, following the latest), the header meters the run's cost and tokens, and the
conversation and models screens read the calls from the store.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import ClassVar

from textual import events, on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Container, Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import var
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Tree
from textual.worker import get_current_worker

from kernelforge_tui.engine.backend import SIMULATED
from kernelforge_tui.engine.takeaway import KERNEL_FILE, PLAN_FILE, SUMMARY_FILE
from kernelforge_tui.engine.view import Changes, LiveCall, RunView, Snapshot
from kernelforge_tui.errors import BadInput
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.keymap import ACTIONS, BY_ACTION, Action, bindings
from kernelforge_tui.tui.screens import (
    ChartScreen,
    ClusterScreen,
    ConversationScreen,
    EditorScreen,
    ExportScreen,
    HelpScreen,
    HintScreen,
    ModelsScreen,
)
from kernelforge_tui.tui.screens.editor import edit_externally, keep_edit, unchanged
from kernelforge_tui.tui.source import NodeSource, RunSource, llm_reads
from kernelforge_tui.tui.themes import load_themes, resolve_theme
from kernelforge_tui.tui.widgets import DiffPane, LogPane, MetricsPane, RunHeaderBar, SearchTree, StreamPane
from kernelforge_tui.tui.widgets.cluster import cluster_text
from kernelforge_tui.tui.widgets.diff import DIFF_BASES, DiffBase
from kernelforge_tui.tui.widgets.metrics import NodeDetail
from kernelforge_tui.tui.widgets.stream import WAITING_ELSEWHERE, WAITING_HERE
from kernelforge_tui.tui.widgets.tree import FILTERS
from kernelforge_tui.vocabulary.commands import (
    AddHint,
    BanSubtree,
    EngineCommand,
    ExpandNode,
    InjectKernel,
    MarkExport,
    Pause,
    PinSubtree,
    ProfileNode,
    Resume,
    Stop,
)
from kernelforge_tui.vocabulary.events import EngineEvent, StateChanged
from kernelforge_tui.vocabulary.nodes import MEASURED, NodeStatus, NodeView

WIDE = 150
"""From this many columns on, the metrics go under the tree and the code takes the wider right column."""
SHORT = 30
"""Below this many rows, the code takes a larger share of the height from the metrics."""
NARROW = 110
"""Below this many columns, the tree takes the whole width on top and the code and the metrics share the rest."""


def over_ssh() -> bool:
    return bool(os.environ.get("SSH_CONNECTION"))


class KernelForgeApp(App[None]):
    TITLE = "Kernel Forge"
    CSS = """
    #header { dock: top; }
    #main { height: 1fr; layout: grid; grid-size: 2 2; grid-columns: 40% 1fr; grid-rows: 3fr 2fr; }
    .pane {
        border: round $primary 30%; border-title-color: $text-muted; border-subtitle-color: $text-muted;
        background: $surface;
    }
    .pane:focus, .pane:focus-within { border: round $primary; border-title-color: $text; border-subtitle-color: $text; }
    #tree { row-span: 2; min-width: 32; height: 100%; }
    #detail { height: 100%; }
    #metrics { height: 100%; }
    #diff, #stream { height: 1fr; }
    #stream, #detail.-streaming #diff { display: none; }
    #detail.-streaming #stream { display: block; }
    #log { height: 6; }
    KernelForgeApp.-short #main { grid-rows: 2fr 1fr; }
    KernelForgeApp.-wide #main { grid-columns: 38% 1fr; grid-rows: 1fr 1fr; }
    KernelForgeApp.-wide #tree { row-span: 1; }
    KernelForgeApp.-wide #detail { row-span: 2; }
    KernelForgeApp.-wide #log { height: 10; }
    /* Narrow (80 columns): the tree the whole width on top, so its labels keep their words; the code under it with
       the metrics beside; panes keep only a top border (their title), the metrics a left one too. */
    KernelForgeApp.-narrow #main { grid-columns: 1fr 34; grid-rows: 2fr 3fr; }
    KernelForgeApp.-narrow #tree { row-span: 1; column-span: 2; min-width: 0; }
    KernelForgeApp.-narrow #log { height: 4; }
    KernelForgeApp.-narrow .pane, KernelForgeApp.-narrow .pane:focus, KernelForgeApp.-narrow .pane:focus-within {
        border: none; border-top: round $primary 30%;
    }
    KernelForgeApp.-narrow .pane:focus, KernelForgeApp.-narrow .pane:focus-within { border-top: round $primary; }
    KernelForgeApp.-narrow #metrics { border-left: round $primary 30%; }
    KernelForgeApp.-narrow #metrics:focus, KernelForgeApp.-narrow #metrics:focus-within {
        border-left: round $primary;
    }
    /* A key that cannot act now is greyed, not dimmed below WCAG AA: it stays readable, and visibly off. */
    FooterKey.-disabled { text-style: none; }
    FooterKey.-disabled .footer-key--key, FooterKey.-disabled .footer-key--description { color: $text-disabled; }
    .pane.-maximized { width: 100% !important; height: 1fr !important; max-height: 100% !important; }
    #detail.-maximized { width: 100% !important; height: 1fr !important; }
    """
    ALLOW_IN_MAXIMIZED_VIEW: ClassVar[str] = "Footer, RunHeaderBar"
    BINDINGS: ClassVar[list[BindingType]] = list(bindings())

    selected: var[int | None] = var[int | None](None, init=False)
    """The node the metrics and diff panes show."""
    diff_base: var[DiffBase] = var[DiffBase]("parent", init=False)
    """What the selected node is diffed against."""
    note: var[str] = var("", init=False)
    """What the header says in place of the search state (a stop on its way)."""
    follow_writing: var[bool] = var(False, init=False)
    """Stream the latest kernel being written, whichever node; otherwise only the selected node's."""

    class EngineFinished(Message):
        """The in-process search returned (or failed: `error`)."""

        def __init__(self, error: str = "") -> None:
            super().__init__()
            self.error = error

    class DetailRead(Message):
        """A node's evaluation and profile (and its parent's), read from the store off the UI thread."""

        def __init__(self, detail: NodeDetail, parent: NodeDetail | None) -> None:
            super().__init__()
            self.detail = detail
            self.parent = parent

    class KernelWritten(Message):
        """The export key's files written (`out_dir`), or why not (`error`)."""

        def __init__(self, node_id: int, out_dir: Path | None, error: str) -> None:
            super().__init__()
            self.node_id = node_id
            self.out_dir = out_dir
            self.error = error

    class DiffRead(Message):
        """A node's source and the source it is diffed against, read from the store off the UI thread."""

        def __init__(self, node_id: int, base_id: int | None, new: str | None, old: str | None) -> None:
            super().__init__()
            self.node_id = node_id
            self.base_id = base_id
            self.new = new
            self.old = old

    def __init__(self, source: RunSource, settings: TuiSettings | None = None, theme: str | None = None) -> None:
        super().__init__()
        self.settings = settings or TuiSettings()
        for custom in load_themes():
            self.register_theme(custom)
        self.theme = resolve_theme(theme or self.settings.theme, self.available_themes)
        self.source = source
        self.llm = llm_reads(source)
        self.state = RunView()
        self.ssh = over_ssh()
        if self.ssh:
            self.animation_level = "none"
        self.quitting = False
        self.cluster = ""
        """Where the search measures, as the header says it (`cluster_text`); empty when not on a cluster here."""
        self._enabled: tuple[bool, str | None] | None = None
        """(steerable, the selected node's status) as the footer last showed it; None until the first focus."""

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield RunHeaderBar(id="header")
        # A grid: narrow, the tree on the left, the code over the metrics on the right; wide (WIDE columns on),
        # the tree over the metrics on the left and the code the whole height of the wider right column.
        with Container(id="main"):
            yield SearchTree(self.state, id="tree", classes="pane")
            with Vertical(id="detail"):
                yield DiffPane(id="diff", classes="pane").data_bind(base=KernelForgeApp.diff_base)
                yield StreamPane(id="stream", classes="pane")
            yield MetricsPane(id="metrics", classes="pane")
        yield LogPane(id="log", classes="pane")
        yield Footer(compact=True)

    async def on_mount(self) -> None:
        if self.settings.keymap:
            self.set_keymap(self.settings.keymap)
        self._open(await self._read_snapshot().wait())
        tree = self.query_one(SearchTree)
        start = self.state.best_id if self.state.best_id is not None else next(iter(self.state.nodes), None)
        if start is not None:
            tree.select_id(start)
            self.selected = start
            await self.workers.wait_for_complete()  # the first screen shows the start node whole
        else:
            self.query_one(DiffPane).show_message("waiting for the first candidate")
        self._enabled = self._enabled_state()
        tree.focus()
        # The footer may have drawn its keys while the run was still being read (a run starts out live): draw them
        # again as check_action answers for the run as opened (the focus above changes nothing when it was there).
        # The screen's own call: the app's waits until its on_mount has returned.
        self.screen.refresh_bindings()
        self.set_interval(1 / self._refresh_hz, self.pump, name="pump")
        if self.source.in_process:
            self.drive_engine()

    @property
    def _refresh_hz(self) -> float:
        return self.settings.ssh_refresh_hz if self.ssh else self.settings.refresh_hz

    @work(thread=True, group="reads")
    def _read_snapshot(self) -> Snapshot:
        return self.source.snapshot()

    def _open(self, snapshot: Snapshot) -> None:
        self.state = RunView.from_snapshot(snapshot)
        tree = self.query_one(SearchTree)
        tree.state = self.state
        tree.rebuild()
        header = self.state.header
        log = self.query_one(LogPane)
        log.started_at = header.started_at
        log.at_rest = not self.state.live
        if log.at_rest and header.started_at is not None:
            log.border_title = (
                f"Log · times of day, the run started {time.strftime('%Y-%m-%d', time.localtime(header.started_at))}"
            )
        log.add(list(self.state.logs))
        self.query_one(MetricsPane).simulated = header.backend == SIMULATED
        self.query_one(StreamPane).waiting_note = WAITING_HERE if self.source.in_process else WAITING_ELSEWHERE
        self._update_header()
        self._follow_cluster()
        self._update_stream()

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width >= WIDE, "-wide")
        self.set_class(event.size.width < NARROW, "-narrow")
        self.set_class(event.size.height < SHORT, "-short")

    # -- engine ---------------------------------------------------------------------------------

    @work(exclusive=True, group="engine", exit_on_error=False)
    async def drive_engine(self) -> None:
        error = ""
        try:
            await self.source.run()
        except Exception as exc:  # the search failed: show it, keep the app (and the store) usable
            error = f"{type(exc).__name__}: {exc}"
        self.post_message(self.EngineFinished(error))

    async def on_kernel_forge_app_engine_finished(self, message: EngineFinished) -> None:
        await self.pump()
        if message.error:
            self.notify(message.error, title="Search failed", severity="error")
        if message.error or self.state.live:
            reason = f"stopped with an error: {message.error}" if message.error else ""
            self.apply_events([StateChanged(state="finished", reason=reason)])
        self.note = ""
        self._refresh_enabled()
        if self.quitting:
            self.exit()

    async def pump(self) -> None:
        """Fold pending events in, and follow the cluster the search measures on (called a few times a second)."""
        events = await self.source.poll_events()
        if not self.query(SearchTree):
            return  # the app closed while the source was read: its widgets are gone
        if events:
            self.apply_events(events)
        self._follow_cluster()

    def _follow_cluster(self) -> None:
        """The header says where a search on a cluster measures now (its GPUs come and go, its throughput moves)."""
        status = self.source.cluster_status()
        cluster = cluster_text(status) if status is not None else ""
        if cluster != self.cluster:
            self.cluster = cluster
            self._update_header()

    def apply_events(self, events: Iterable[EngineEvent]) -> Changes:
        changes = self.state.apply(events)
        if not changes:
            return changes
        tree = self.query_one(SearchTree)
        tree.apply(changes)
        self.query_one(LogPane).add(changes.logs)
        if changes.header:
            if not self.state.live:
                self.note = ""  # a "stopping" said here is over once the writer has finished
            self._update_header()
            self._refresh_enabled()
        selected = self.selected
        if selected is None:
            if changes.added and tree.select_id(changes.added[0]):
                self.selected = changes.added[0]
        elif selected in self.state.nodes:
            touched = set(changes.changed)
            if selected in touched:
                self._refresh_enabled()  # measured or failed now: the node keys follow
            if selected in touched or self.state.nodes[selected].parent_id in touched:
                self._load_detail(selected)
            if changes.best_changed and self.diff_base == "best":
                self._load_diff(selected)
        if changes.calls:
            self._update_stream()
            self._update_llm_screens(changes)
        if (changes.added or changes.changed) and isinstance(self.screen, ChartScreen):
            self.screen.show(self.state)
        return changes

    # -- LLM calls: the stream in the diff's place, the conversation and models screens ---------

    def _streamed_call(self) -> LiveCall | None:
        """The kernel being written that the diff's place shows: the selected node's, or the latest of any node's
        when following."""
        if self.follow_writing:
            return self.state.writing_call()
        return self.state.writing_call(self.selected) if self.selected is not None else None

    def _update_stream(self) -> None:
        """Show the call being written in the diff's place, with what is new of it; back to the diff at its end."""
        try:
            stream, diff, detail = self.query_one(StreamPane), self.query_one(DiffPane), self.query_one("#detail")
        except NoMatches:  # the app is closing and its panes are gone
            return
        call = self._streamed_call()
        if call is None:
            if stream.key is not None:
                stream.stop()
                detail.remove_class("-streaming")
                if stream.has_focus:
                    diff.focus()
            return
        if stream.key != call.key:
            stream.follow(call)
        else:
            stream.catch_up(call)
        if not detail.has_class("-streaming"):
            detail.add_class("-streaming")
            if diff.has_focus:
                stream.focus()

    def _update_llm_screens(self, changes: Changes) -> None:
        """An open conversation follows its node's calls (a new read when one ends); the models screen rereads
        when calls end."""
        for screen in self.screen_stack:
            if isinstance(screen, ConversationScreen):
                node_id = screen.node_id
                live = self.state.calls_for(node_id)
                if any(c.node_id == node_id or c.child_id == node_id for c in changes.ended_calls):
                    screen.reload(live)
                elif any(k in self.state.calls and self.state.calls[k].node_id == node_id for k in changes.calls):
                    screen.show_live(live)
            elif isinstance(screen, ModelsScreen) and changes.ended_calls:
                screen.reload()

    # -- selection and the panes that follow it -------------------------------------------------

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[int]) -> None:
        if event.node.data is not None:
            self.selected = event.node.data

    def watch_selected(self, node_id: int | None) -> None:
        self._refresh_enabled()
        if node_id is not None and node_id in self.state.nodes:
            self._load_detail(node_id)
            self._load_diff(node_id)
        if not self.follow_writing:
            self._update_stream()

    def watch_follow_writing(self) -> None:
        self._update_stream()

    def watch_diff_base(self) -> None:
        if self.selected is not None:
            self._load_diff(self.selected)

    def watch_note(self) -> None:
        self._update_header()

    def _load_detail(self, node_id: int) -> None:
        node = self.state.nodes[node_id]
        self._read_detail(node, self.state.nodes.get(node.parent_id) if node.parent_id is not None else None)

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False)
    def _read_detail(self, node: NodeView, parent: NodeView | None) -> None:
        def read(of: NodeView) -> NodeDetail:
            return NodeDetail(node=of, evaluation=self.source.evaluation(of.id), profile=self.source.profile(of.id))

        detail = read(node).model_copy(
            update={"agents": self.llm.agent_facts(node.id), "reward": self.source.reward(node.id)}
        )
        parent_detail = read(parent) if parent is not None else None
        if not get_current_worker().is_cancelled:
            self.post_message(self.DetailRead(detail, parent_detail))

    @on(DetailRead)
    def _show_detail(self, message: DetailRead) -> None:
        if message.detail.node.id == self.selected:
            # A read can land while the app closes and its panes are gone: then there is nothing to show.
            for pane in self.query(MetricsPane):
                pane.show(message.detail, message.parent)

    def _diff_base_of(self, node_id: int) -> tuple[int | None, str]:
        """The node the diff compares `node_id` with, and its name."""
        parent = self.state.nodes[node_id].parent_id
        if self.diff_base == "parent" and parent is not None:
            return parent, f"#{parent}"
        if self.diff_base == "best":
            best = self.state.best_id
            return best, f"best #{best}" if best is not None else "no best yet"
        return self.state.root_id, "baseline"

    def _load_diff(self, node_id: int) -> None:
        self._read_diff(node_id, self._diff_base_of(node_id)[0])

    @work(thread=True, exclusive=True, group="diff", exit_on_error=False)
    def _read_diff(self, node_id: int, base_id: int | None) -> None:
        new = self.source.node_source(node_id)
        old = self.source.node_source(base_id) if base_id is not None else None
        if not get_current_worker().is_cancelled:
            self.post_message(self.DiffRead(node_id, base_id, new[0] if new else None, old[0] if old else None))

    @on(DiffRead)
    def _show_diff(self, message: DiffRead) -> None:
        if message.node_id != self.selected or message.node_id not in self.state.nodes:
            return
        base_id, base_name = self._diff_base_of(message.node_id)
        if base_id != message.base_id:
            return  # the base moved on (a new best, another mode) and its own read is on its way
        for pane in self.query(DiffPane):  # none once the app is closing (a read can land after that)
            if message.new is None:
                pane.show_message(f"#{message.node_id}: no source recorded")
            else:
                pane.show(message.old, message.new, base_name, f"#{message.node_id}")

    def _update_header(self) -> None:
        state = self.state
        self.query_one(RunHeaderBar).show(
            state.header, state.budget, len(state.nodes), state.failures, self.note, state.spend(), self.cluster
        )
        self.sub_title = state.header.card_name

    # -- steering -------------------------------------------------------------------------------

    @property
    def steerable(self) -> bool:
        """Whether a search hears commands now: a live source and a run not finished."""
        return self.source.can_steer and self.state.live

    def why_disabled(self, action: str) -> str | None:
        """Why a key cannot act now (None: it can): what `check_action` and the command palette say."""
        spec = BY_ACTION.get(action)
        if spec is None:
            return None
        at_rest = spec.at_rest and self.source.can_steer and not self.state.live  # flags on a run nobody writes
        if spec.steering and not self.steerable and not at_rest:
            if not self.source.can_steer:
                return "the run is opened read-only or has ended"
            return "the run has finished"
        node = self._selected_node()
        if spec.on_node and node is None:
            return "no node is selected"
        if node is not None and spec.measured and node.status not in MEASURED:
            return f"#{node.id} is {node.status}, not measured"
        if node is not None and spec.takes_children and node.status == NodeStatus.FAILED:
            return f"#{node.id} failed: it gets no children"
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys that cannot act are disabled (shown dimmed, deaf): steering keys on a run that cannot be steered,
        node keys while none is selected or on a node they cannot act on (expanding or profiling an unmeasured
        node, hints for a failed one)."""
        return None if self.why_disabled(action) is not None else True

    def _enabled_state(self) -> tuple[bool, str | None]:
        node = self._selected_node()
        return self.steerable, node.status if node is not None else None

    def _refresh_enabled(self) -> None:
        """Redraw the bindings when what `check_action` answers may have changed (not on every selection)."""
        enabled = self._enabled_state()
        if self._enabled is not None and enabled != self._enabled:
            self._enabled = enabled
            self.refresh_bindings()

    async def send_command(self, command: EngineCommand, what: str) -> None:
        await self.source.send(command)
        self.query_one(LogPane).note(what)

    def _selected_node(self) -> NodeView | None:
        return self.state.nodes.get(self.selected) if self.selected is not None else None

    async def action_pause_resume(self) -> None:
        if self.state.header.state == "paused":
            await self.send_command(Resume(), "resume sent")
        else:
            await self.send_command(Pause(), "pause sent")

    async def action_expand(self) -> None:
        if node := self._selected_node():
            await self.send_command(ExpandNode(node_id=node.id), f"expand #{node.id} next")

    async def action_profile(self) -> None:
        if node := self._selected_node():
            await self.send_command(ProfileNode(node_id=node.id), f"profile #{node.id} next")

    def action_hint(self) -> None:
        node = self._selected_node()
        if node is None:
            return

        async def done(text: str | None) -> None:
            if text:
                await self.send_command(AddHint(node_id=node.id, text=text), f"hint for #{node.id}: {text}")

        self.push_screen(HintScreen(node.id), done)

    @work(thread=True, group="reads", exit_on_error=False)
    def _read_source(self, node_id: int) -> NodeSource | None:
        return self.source.node_source(node_id)

    async def _editable(self) -> tuple[NodeView, NodeSource] | None:
        """The selected node with its source and plan (read off the UI thread), or None and a note why."""
        node = self._selected_node()
        if node is None:
            return None
        got = await self._read_source(node.id).wait()
        if got is None:
            self.notify(f"#{node.id} has no recorded source to edit.", severity="warning")
            return None
        return node, got

    async def _submit_child(self, node: NodeView, text: str, source: NodeSource) -> None:
        command = InjectKernel(parent_id=node.id, source=text, plan=source[1])
        await self.send_command(command, f"hand-written child of #{node.id} submitted")

    async def action_edit(self) -> None:
        editable = await self._editable()
        if editable is None:
            return
        node, source = editable

        async def done(text: str | None) -> None:
            if text is not None:
                await self._submit_child(node, text, source)

        self.push_screen(EditorScreen(node.id, source[0], partial(self.why_disabled, "edit")), done)

    async def action_edit_external(self) -> None:
        editable = await self._editable()
        if editable is None:
            return
        node, source = editable
        text = edit_externally(self, node.id, source[0])
        if text is None:
            return
        why = self.why_disabled("edit_external")
        if unchanged(text, source[0]):
            self.notify(f"No change from #{node.id}: nothing submitted.", severity="warning")
        elif why is not None:
            kept = keep_edit(node.id, text)
            self.notify(f"Not submitted: {why}. Your edit is kept in {kept}.", severity="error")
        else:
            await self._submit_child(node, text, source)

    async def action_ban(self) -> None:
        if node := self._selected_node():
            banned = not node.banned
            word = "ban" if banned else "unban"
            await self.send_command(BanSubtree(node_id=node.id, banned=banned), f"{word} subtree #{node.id}")

    async def action_pin(self) -> None:
        if node := self._selected_node():
            pinned = not node.pinned
            word = "pin" if pinned else "unpin"
            await self.send_command(PinSubtree(node_id=node.id, pinned=pinned), f"{word} subtree #{node.id}")

    def action_export_kernel(self) -> None:
        """Ask where (a folder under `kernels/` beside the run, editable), then write the selected node's kernel.cu,
        plan.toml and summary.md there off the UI thread; the log and a toast say where they went."""
        node = self._selected_node()
        if node is None:
            return

        def done(out_dir: Path | None) -> None:
            if out_dir is not None:
                self._write_kernel(node.id, out_dir)

        self.push_screen(ExportScreen(node.id, self.source.kernel_dir(node.id)), done)

    @work(thread=True, group="export", exit_on_error=False)
    def _write_kernel(self, node_id: int, out_dir: Path) -> None:
        try:
            written = self.source.write_kernel(node_id, out_dir)
        except (BadInput, LookupError) as exc:  # a folder that cannot be written; a node the store does not hold
            self.post_message(self.KernelWritten(node_id, None, str(exc)))
        else:
            self.post_message(self.KernelWritten(node_id, written, ""))

    @on(KernelWritten)
    async def _kernel_written(self, message: KernelWritten) -> None:
        if message.out_dir is None:
            self.query_one(LogPane).note(f"export of #{message.node_id} failed: {message.error}")
            self.notify(message.error, title=f"#{message.node_id} not exported", severity="error")
            return
        where = message.out_dir.resolve()
        self.query_one(LogPane).note(
            f"#{message.node_id} exported to {where} ({KERNEL_FILE}, {PLAN_FILE}, {SUMMARY_FILE})"
        )
        self.notify(str(where), title=f"#{message.node_id} exported")
        node = self.state.nodes.get(message.node_id)
        if self.steerable and node is not None and not node.export:
            # Marked too, so `kernelforge export` packages the kernel the user took (and the tree shows ★).
            await self.send_command(
                MarkExport(node_id=message.node_id, export=True), f"#{message.node_id} marked for export"
            )

    async def action_stop(self) -> None:
        await self.send_command(Stop(), "stop sent: in-flight candidates finish, the run stays resumable")
        self.note = "stopping"

    # -- navigation -----------------------------------------------------------------------------

    def action_jump_best(self) -> None:
        best = self.state.best_id
        if best is None:
            self.notify("No timed node yet.")
            return
        tree = self.query_one(SearchTree)
        if not tree.select_id(best) and tree.filter_mode != "all":
            tree.filter_mode = "all"  # the filter hides the best node: show the whole tree
            tree.select_id(best)
        self.selected = best
        tree.focus()

    def action_cycle_filter(self) -> None:
        tree = self.query_one(SearchTree)
        tree.filter_mode = FILTERS[(FILTERS.index(tree.filter_mode) + 1) % len(FILTERS)]

    def action_cycle_diff_base(self) -> None:
        self.diff_base = DIFF_BASES[(DIFF_BASES.index(self.diff_base) + 1) % len(DIFF_BASES)]

    def action_toggle_diff_layout(self) -> None:
        diff = self.query_one(DiffPane)
        diff.side_by_side = not diff.side_by_side

    def action_toggle_diff_folds(self) -> None:
        diff = self.query_one(DiffPane)
        diff.folded = not diff.folded

    def _focused_pane(self) -> Widget:
        """The pane the focus is in; the code (the diff, or the kernel being written in its place) when none."""
        focused = self.screen.focused
        while focused is not None and not focused.has_class("pane"):
            focused = focused.parent if isinstance(focused.parent, Widget) else None
        if focused is not None:
            return focused
        streaming = self.query_one("#detail").has_class("-streaming")
        return self.query_one(StreamPane) if streaming else self.query_one(DiffPane)

    def action_toggle_maximize(self) -> None:
        """The focused pane fills the screen below the header (the footer stays); again, or esc, restores it."""
        screen = self.screen
        if screen.maximized is not None:
            screen.minimize()
            return
        pane = self._focused_pane()
        screen.maximize(pane, container=False)
        pane.focus()

    def action_conversation(self) -> None:
        """The selected node's LLM calls (the same key closes them)."""
        node = self._selected_node()
        if node is None:
            return
        read = partial(self.llm.llm_calls, node.id)
        live = self.state.calls_for(node.id)
        keys = self._active_keys()["conversation"]
        self.push_screen(ConversationScreen(node.id, read, live, self.source.in_process, close_keys=keys))

    def action_chart(self) -> None:
        """The fastest speedup and best ceiling share so far over the candidates (the same key closes it)."""
        self.push_screen(ChartScreen(self.state, close_keys=self._active_keys()["chart"]))

    def action_models(self) -> None:
        """The run's providers and models compared (the same key closes them)."""
        simulated = self.state.header.backend == SIMULATED
        self.push_screen(ModelsScreen(self.llm.model_records, simulated, close_keys=self._active_keys()["models"]))

    def action_cluster(self) -> None:
        """Where the run measures: the live cluster's workers, or the store's count per GPU (the same key closes it)."""
        screen = ClusterScreen(
            self.source.cluster_status,
            self.source.measured_on,
            in_process=self.source.in_process,
            every_s=1 / self._refresh_hz,
            close_keys=self._active_keys()["cluster"],
        )
        self.push_screen(screen)

    def action_toggle_follow_writing(self) -> None:
        self.follow_writing = not self.follow_writing
        following = "the latest kernel being written, on any node" if self.follow_writing else "the selected node"
        self.query_one(LogPane).note(f"streaming {following}")

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self._active_keys()))

    def _active_keys(self) -> dict[str, str]:
        keys = {a.id: a.key for a in ACTIONS}
        keys.update(self.settings.keymap)
        return keys

    async def action_quit_app(self) -> None:
        """In-process: ask the search to stop (in-flight work finishes, the run stays resumable), then exit
        when it returns; q again exits at once. Following a store: detach."""
        if self.quitting or not (self.source.in_process and self.steerable):
            await self.source.close()
            self.exit()
            return
        self.quitting = True
        self.note = "stopping, then quitting (q again: quit now)"
        await self.source.send(Stop())

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        keys = self._active_keys()
        for action in ACTIONS:
            key = keys.get(action.id, action.key).replace("question_mark", "?")
            run = partial(self._run_bound, action)
            why = self.why_disabled(action.action)
            note = f" · not now: {why}" if why else ""
            yield SystemCommand(action.help, f"key {key} · binding id {action.id}{note}", run)

    async def _run_bound(self, spec: Action) -> None:
        """Run an action as its key would: on its pane's widget (`pane`), else on the app (from the palette)."""
        target = self.screen_stack[0].query_one(f"#{spec.pane}") if spec.pane else self
        await self.run_action(spec.action, target)
