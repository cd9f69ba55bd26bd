"""The Kernel Forge TUI: watch a search tree grow, dig into any candidate, steer from the keyboard.

The app knows a run only through a `RunSource` (an in-process search or a store followed by polling).
Events are folded into a `RunState` a few times a second (fewer over SSH) and only what changed is
repainted. Every steering key sends a typed engine command through the source.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import ClassVar

from textual import events, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Tree

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.models.commands import (
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
from kernelforge_tui.models.events import EngineEvent
from kernelforge_tui.models.nodes import NodeView
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.keymap import ACTIONS, bindings
from kernelforge_tui.tui.messages import CommandSent, EngineFinished, RunUpdated
from kernelforge_tui.tui.screens import EditorScreen, HelpScreen, HintScreen
from kernelforge_tui.tui.source import RunSource
from kernelforge_tui.tui.state import Changes, RunState
from kernelforge_tui.tui.themes import load_themes, resolve_theme_name
from kernelforge_tui.tui.widgets import DiffPane, LogPane, MetricsPane, RunHeaderBar, SearchTree
from kernelforge_tui.tui.widgets.diff import DIFF_BASES, DiffBase
from kernelforge_tui.tui.widgets.metrics import NodeDetail, parse_profile
from kernelforge_tui.tui.widgets.tree import FILTERS

WIDE = 150
"""From this many columns on, metrics and diff sit side by side."""


def over_ssh() -> bool:
    return bool(os.environ.get("SSH_CONNECTION"))


class KernelForgeApp(App[None]):
    TITLE = "Kernel Forge"
    CSS = """
    #main { height: 1fr; }
    .pane { border: round $primary 30%; border-title-color: $text-muted; background: $surface; }
    .pane:focus, .pane:focus-within { border: round $primary; border-title-color: $text; }
    #tree { width: 45%; min-width: 32; }
    #detail { width: 1fr; }
    #metrics { height: auto; max-height: 50%; }
    #diff { height: 1fr; }
    #log { height: 6; }
    KernelForgeApp.-wide #tree { width: 36%; }
    KernelForgeApp.-wide #detail { layout: horizontal; }
    KernelForgeApp.-wide #metrics { width: 46; height: 100%; max-height: 100%; }
    KernelForgeApp.-wide #diff { width: 1fr; height: 100%; }
    KernelForgeApp.-wide #log { height: 10; }
    """
    BINDINGS: ClassVar[list[BindingType]] = list(bindings())

    def __init__(self, source: RunSource, settings: TuiSettings | None = None, theme: str | None = None) -> None:
        super().__init__()
        self.settings = settings or TuiSettings()
        for custom in load_themes():
            self.register_theme(custom)
        name = resolve_theme_name(theme or self.settings.theme)
        if name not in self.available_themes:
            raise ValueError(f"unknown theme {name!r}; try one of: dark, light, high-contrast, ansi")
        self.theme = name
        self.source = source
        self.state = RunState()
        self.ssh = over_ssh()
        if self.ssh:
            self.animation_level = "none"
        self.diff_base: DiffBase = "parent"
        self.quitting = False
        self.selected: int | None = None
        self._note = ""

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield RunHeaderBar(id="header")
        with Horizontal(id="main"):
            yield SearchTree(self.state, id="tree")
            with Vertical(id="detail"):
                yield MetricsPane(id="metrics")
                yield DiffPane(id="diff")
        yield LogPane(id="log")
        yield Footer()

    def on_mount(self) -> None:
        for pane_id, title in (("tree", "Tree"), ("metrics", "Metrics"), ("diff", "Diff"), ("log", "Log")):
            pane = self.query_one(f"#{pane_id}")
            pane.add_class("pane")
            pane.border_title = title
        if self.settings.keymap:
            self.set_keymap(self.settings.keymap)
        self.state = RunState.from_snapshot(self.source.snapshot())
        tree = self.query_one(SearchTree)
        tree.state = self.state
        tree.rebuild()
        log = self.query_one(LogPane)
        log.started_at = self.state.header.started_at
        log.add(list(self.state.logs))
        self._update_titles()
        self._update_header()
        start = self.state.best_id if self.state.best_id is not None else next(iter(self.state.nodes), None)
        if start is not None:
            tree.select_id(start)
            self._select(start)
        else:
            self.query_one(DiffPane).show_message("waiting for the first candidate")
        tree.focus()
        hz = self.settings.ssh_refresh_hz if self.ssh else self.settings.refresh_hz
        self.set_interval(1 / hz, self.pump, name="pump")
        if self.source.in_process:
            self.drive_engine()

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width >= WIDE, "-wide")

    # -- engine ---------------------------------------------------------------------------------

    @work(exclusive=True, group="engine", exit_on_error=False)
    async def drive_engine(self) -> None:
        error = ""
        try:
            await self.source.run()
        except Exception as exc:  # the search failed: show it, keep the app (and the store) usable
            error = f"{type(exc).__name__}: {exc}"
        self.post_message(EngineFinished(error))

    def on_engine_finished(self, message: EngineFinished) -> None:
        self.pump()
        if message.error:
            self.query_one(LogPane).note(f"the search stopped with an error: {message.error}")
            self.notify(message.error, title="Search failed", severity="error")
        if self.state.header.state != "finished":
            self.state.header.state = "finished"
        self._note = ""
        self._update_header()
        if self.quitting:
            self.exit()

    def pump(self) -> None:
        """Fold pending events in (called a few times a second)."""
        events = self.source.poll_events()
        if events:
            self.apply_events(events)

    def apply_events(self, events: Iterable[EngineEvent]) -> Changes:
        changes = self.state.apply(events)
        if changes:
            self.query_one(SearchTree).apply(changes)
            self.query_one(LogPane).add(changes.logs)
            if changes.header:
                self._update_header()
            self.post_message(RunUpdated(changes))
            selected = self.selected
            if selected is not None and selected in self.state.nodes:
                node = self.state.nodes[selected]
                touched = set(changes.changed)
                if selected in touched or (node.parent_id in touched):
                    self._select(selected, diff=False)
                if changes.best_changed and self.diff_base == "best":
                    self._show_diff(selected)
            elif self.selected is None and changes.added:
                tree = self.query_one(SearchTree)
                if tree.select_id(changes.added[0]):
                    self._select(changes.added[0])
        return changes

    # -- selection and panes --------------------------------------------------------------------

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[int]) -> None:
        if event.node.data is not None and event.node.data != self.selected:
            self._select(event.node.data)

    def _detail(self, node: NodeView) -> NodeDetail:
        return NodeDetail(
            node=node,
            evaluation=self.source.evaluation(node.id),
            profile=parse_profile(self.source.profile(node.id)),
        )

    def _select(self, node_id: int, diff: bool = True) -> None:
        node = self.state.nodes.get(node_id)
        if node is None:
            return
        self.selected = node_id
        parent = self.state.nodes.get(node.parent_id) if node.parent_id is not None else None
        self.query_one(MetricsPane).show(self._detail(node), self._detail(parent) if parent is not None else None)
        if diff:
            self._show_diff(node_id)

    def _show_diff(self, node_id: int) -> None:
        pane = self.query_one(DiffPane)
        got = self.source.source(node_id)
        if got is None:
            pane.show_message(f"#{node_id}: no source recorded")
            return
        new = got[0]
        node = self.state.nodes[node_id]
        old: str | None
        if self.diff_base == "parent":
            parent = self.source.source(node.parent_id) if node.parent_id is not None else None
            old, old_name = (parent[0] if parent else None), (f"#{node.parent_id}" if node.parent_id else "no parent")
            if node.parent_id is None:
                old, old_name = self.source.baseline_source(), "baseline"
        elif self.diff_base == "baseline":
            old, old_name = self.source.baseline_source(), "baseline"
        else:
            best = self.state.best_id
            found = self.source.source(best) if best is not None else None
            old, old_name = (found[0] if found else None), (f"best #{best}" if best is not None else "no best yet")
        pane.show(old, new, old_name, f"#{node_id}")

    def _update_titles(self) -> None:
        tree = self.query_one(SearchTree)
        label = {"all": "all", "improving": "only improving", "failures": "only failures"}[tree.filter_mode]
        tree.border_title = f"Tree · {label}"
        diff = self.query_one(DiffPane)
        layout = "side by side" if diff.side_by_side else "unified"
        diff.border_title = f"Diff vs {self.diff_base} · {layout}"

    def _update_header(self) -> None:
        self.query_one(RunHeaderBar).show(
            self.state.header, self.state.budget, len(self.state.nodes), self.state.failures, self._note
        )
        self.sub_title = self.state.header.card_name

    # -- steering -------------------------------------------------------------------------------

    async def send_command(self, command: EngineCommand, what: str) -> bool:
        if not self.source.can_steer:
            self.notify("This run is not live: there is nothing to steer.", severity="warning")
            return False
        await self.source.send(command)
        self.query_one(LogPane).note(what)
        self.post_message(CommandSent(command))
        return True

    def _selected_node(self) -> NodeView | None:
        node = self.state.nodes.get(self.selected) if self.selected is not None else None
        if node is None:
            self.notify("Select a node first.", severity="warning")
        return node

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

    def _editable(self) -> tuple[NodeView, str, LaunchPlan] | None:
        """The selected node with its source and plan, or None (and a note saying why)."""
        node = self._selected_node()
        if node is None:
            return None
        got = self.source.source(node.id)
        if got is None:
            self.notify(f"#{node.id} has no recorded source to edit.", severity="warning")
            return None
        return node, *got

    async def _submit_child(self, node: NodeView, text: str, plan: LaunchPlan) -> None:
        command = InjectKernel(parent_id=node.id, source=text, plan=plan)
        await self.send_command(command, f"hand-written child of #{node.id} submitted")

    def action_edit(self) -> None:
        editable = self._editable()
        if editable is None:
            return
        node, source, plan = editable

        async def done(text: str | None) -> None:
            if text is not None:
                await self._submit_child(node, text, plan)

        self.push_screen(EditorScreen(node.id, source), done)

    async def action_edit_external(self) -> None:
        editable = self._editable()
        if editable is None:
            return
        node, source, plan = editable
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"node-{node.id}.cu"
            path.write_text(source)
            try:
                with self.suspend():
                    subprocess.run([*shlex.split(editor), str(path)], check=False)
            except Exception as exc:  # SuspendNotSupported (headless, some terminals), editor missing
                self.notify(f"Could not run {editor}: {exc}", severity="error")
                return
            text = path.read_text()
        if text.strip() != source.strip():
            await self._submit_child(node, text, plan)

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

    async def action_mark_export(self) -> None:
        if node := self._selected_node():
            export = not node.export
            word = "mark" if export else "unmark"
            await self.send_command(MarkExport(node_id=node.id, export=export), f"{word} #{node.id} for export")

    async def action_stop(self) -> None:
        if await self.send_command(Stop(), "stop sent: in-flight candidates finish, the run stays resumable"):
            self._note = "stopping"
            self._update_header()

    # -- navigation -----------------------------------------------------------------------------

    def action_jump_best(self) -> None:
        best = self.state.best_id
        if best is None:
            self.notify("No timed node yet.")
            return
        tree = self.query_one(SearchTree)
        if tree.filter_mode != "all" and best not in tree._tree_node:
            tree.set_filter("all")
            self._update_titles()
        if tree.select_id(best):
            self._select(best)
        tree.focus()

    def action_cycle_filter(self) -> None:
        tree = self.query_one(SearchTree)
        tree.set_filter(FILTERS[(FILTERS.index(tree.filter_mode) + 1) % len(FILTERS)])
        self._update_titles()

    def action_cycle_diff_base(self) -> None:
        self.diff_base = DIFF_BASES[(DIFF_BASES.index(self.diff_base) + 1) % len(DIFF_BASES)]
        self._update_titles()
        if self.selected is not None:
            self._show_diff(self.selected)

    def action_toggle_diff_layout(self) -> None:
        diff = self.query_one(DiffPane)
        diff.set_side_by_side(not diff.side_by_side)
        self._update_titles()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self._active_keys()))

    def _active_keys(self) -> dict[str, str]:
        keys = {a.id: a.key for a in ACTIONS}
        keys.update(self.settings.keymap)
        return keys

    async def action_quit_app(self) -> None:
        """In-process: ask the search to stop (in-flight work finishes, the run stays resumable), then exit
        when it returns; q again exits at once. Following a store: detach."""
        if self.quitting or not (self.source.in_process and self.source.can_steer):
            await self.source.close()
            self.exit()
            return
        self.quitting = True
        self._note = "stopping, then quitting (q again: quit now)"
        self._update_header()
        await self.source.send(Stop())
        self.post_message(CommandSent(Stop()))

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        keys = self._active_keys()
        for action in ACTIONS:
            key = keys.get(action.id, action.key).replace("question_mark", "?")
            yield SystemCommand(action.help, f"key {key} · binding id {action.id}",
                                partial(self.run_action, action.action))  # fmt: skip
