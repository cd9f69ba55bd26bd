"""The keys as the help names them, the tree's filter keeping the reader's place, and the footer following
check_action from the first screen on (issue 34)."""

from __future__ import annotations

import time

import pytest
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets._footer import FooterKey

from kernelforge_tui.engine.view import Snapshot
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.keymap import ACTIONS
from kernelforge_tui.tui.screens.help import KEY_NOTES
from kernelforge_tui.tui.widgets import SearchTree
from kernelforge_tui.tui.widgets.tree import EMPTY
from tests.support.fakes.synthetic import SyntheticSource
from tests.support.fakes.tui import screen_text, settle


def make_app(source: SyntheticSource | None = None, **settings: object) -> KernelForgeApp:
    return KernelForgeApp(source or SyntheticSource(40), TuiSettings(**settings))  # type: ignore[arg-type]


async def bound(app: KernelForgeApp, pilot: Pilot[None], widget: Widget, key: str) -> str:
    """The action `key` runs while `widget` has the focus, as Textual resolves it (its own, its ancestors', the
    app's)."""
    widget.focus()
    await pilot.pause()
    active = app.screen.active_bindings.get(key)
    assert active is not None, f"{key} is bound to nothing while {widget} has the focus"
    return active.binding.action


async def test_every_key_the_help_names_runs_the_action_it_describes() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for action in ACTIONS:
            where = app.query_one(f"#{action.pane}") if action.pane else app.query_one(SearchTree)
            for key in action.key.split(","):
                assert await bound(app, pilot, where, key) == action.action, f"{action.id}: {key}"
        for _, notes in KEY_NOTES:
            for note in notes:
                for key, described in zip(note.keys, note.actions, strict=True):
                    assert await bound(app, pilot, app.query_one(note.pane), key) == described, f"{note.words}: {key}"


async def test_right_opens_a_tree_node_and_left_closes_it_and_goes_up() -> None:
    app = make_app(SyntheticSource(60))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        tree = app.query_one(SearchTree)
        tree.focus()
        closed = next(n for n in tree._tree_node.values() if n.allow_expand and not n.is_expanded)
        tree.move_cursor(closed, animate=False)
        await pilot.press("right")
        assert closed.is_expanded
        await pilot.press("right")
        assert tree.cursor_node is closed.children[0]
        await pilot.press("left")  # a leaf or a closed child: up to its parent
        assert tree.cursor_node is closed
        await pilot.press("left")
        assert not closed.is_expanded


async def test_the_tree_keys_are_remappable() -> None:
    app = make_app(SyntheticSource(60), keymap={"tree_open": "l"})
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        tree = app.query_one(SearchTree)
        tree.focus()
        closed = next(n for n in tree._tree_node.values() if n.allow_expand and not n.is_expanded)
        tree.move_cursor(closed, animate=False)
        await pilot.press("l")
        assert closed.is_expanded


async def test_cycling_the_filter_back_to_all_keeps_the_selected_node_selected_and_in_view() -> None:
    app = make_app(SyntheticSource(120))
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(app, pilot)
        tree = app.query_one(SearchTree)
        measured = [i for i, n in app.state.nodes.items() if n.status != "failed"]
        deep = max(measured, key=lambda i: (len(app.state.path_to(i)), i))
        tree.select_id(deep)
        await settle(app, pilot)
        assert app.selected == deep
        for _ in range(3):  # improving, failures (which hide it), all again
            await pilot.press("f")
            await settle(app, pilot)
            assert app.selected == deep  # the panes keep showing it while a filter hides it
        assert tree.filter_mode == "all"
        assert tree.cursor_node is not None and tree.cursor_node.data == deep
        assert all(tree._tree_node[i].is_expanded for i in app.state.path_to(deep)[:-1])
        first, last = tree.scroll_offset.y, tree.scroll_offset.y + tree.scrollable_content_region.height
        assert first <= tree.cursor_line < last


async def test_a_filter_that_lists_nothing_says_so_in_the_pane() -> None:
    source = SyntheticSource(40)
    for node_id, node in list(source.nodes.items()):  # a run without failures
        if node.status == "failed":
            source.nodes[node_id] = node.model_copy(update={"status": "timed", "failure": None, "speedup": 1.1})
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("f", "f")
        await settle(app, pilot)
        assert app.query_one(SearchTree).filter_mode == "failures"
        assert EMPTY["failures"].split(":")[0] in screen_text(app)


async def test_the_improving_filter_names_the_parent_in_words() -> None:
    app = make_app(SyntheticSource(40))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("f")
        await settle(app, pilot)
        text = screen_text(app)
        improving = [i for i in app.query_one(SearchTree).matching() if app.state.nodes[i].parent_id is not None]
        node = app.state.nodes[improving[-1]]
        assert f"#{node.id} from #{node.parent_id} {node.status}" in text
        assert f"#{node.id}<" not in text


class SlowSnapshot(SyntheticSource):
    """A run whose store takes a while to read, so the footer draws its keys before the run is known."""

    def snapshot(self) -> Snapshot:
        time.sleep(1.0)
        return super().snapshot()


async def test_the_footer_greys_pause_on_a_finished_run_from_the_first_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    # As in a terminal, the tree has the focus before the run is read: focusing it again redraws nothing.
    monkeypatch.setattr(KernelForgeApp, "AUTO_FOCUS", "#tree")
    app = make_app(SlowSnapshot(20, state="finished"))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert app.check_action("pause_resume", ()) is None
        footer = {key.key: key.has_class("-disabled") for key in app.query(FooterKey)}
        assert footer["p"] and not footer["g"]
