"""Pilot tests of the TUI over a deterministic synthetic run: every binding sends its typed command and
the screen shows the engine's answer; steering keys are disabled where they cannot act; reads from the
source stay off the UI thread; filters, jumps, diff modes, help, palette, keymap, quit."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import pytest
from textual.message import Message
from textual.notifications import Notify
from textual.widgets import TextArea

from kernelforge_tui.tui import app as tui_app
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.keymap import ACTIONS, BY_ID, Action
from kernelforge_tui.tui.screens import EditorScreen, HelpScreen, HintScreen
from kernelforge_tui.tui.screens.editor import edit_externally
from kernelforge_tui.tui.widgets import DiffPane, LogPane, MetricsPane, SearchTree
from kernelforge_tui.vocabulary.commands import (
    AddHint,
    BanSubtree,
    ExpandNode,
    InjectKernel,
    Pause,
    PinSubtree,
    ProfileNode,
    Resume,
    Stop,
)
from kernelforge_tui.vocabulary.events import StateChanged
from tests.support.fakes.synthetic import SyntheticSource
from tests.support.fakes.tui import screen_text, settle

STEERING_ACTIONS = [a for a in ACTIONS if a.steering]


def make_app(source: SyntheticSource | None = None, **settings: object) -> KernelForgeApp:
    return KernelForgeApp(source or SyntheticSource(40), TuiSettings(**settings))  # type: ignore[arg-type]


async def test_opens_on_the_best_node_with_its_metrics_and_diff() -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        best = source.best
        assert best is not None and app.selected == best.id
        text = screen_text(app)
        assert f"best {best.speedup:.2f}x #{best.id}" in text
        assert "speedup" in text and "ceiling" in text and "registers" in text
        assert f"Diff #{best.id} vs parent #{best.parent_id} · unified" in text  # the diff against the parent
        assert "compile failed" in text  # the log, with the offending line below
        assert "m = fmaxf(m, in4.x);" in text


STEERING = [
    ("p", Pause, "paused"),
    ("x", ExpandNode, "expanding #"),
    ("n", ProfileNode, "profiling #"),
    ("b", BanSubtree, "⊘"),
    ("t", PinSubtree, "⇡"),
    ("S", Stop, "stopping"),
]


@pytest.mark.parametrize(("key", "command", "shown"), STEERING, ids=[c.__name__ for _, c, _ in STEERING])
async def test_each_steering_key_sends_its_command_and_shows_the_answer(key: str, command: type, shown: str) -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        selected = app.selected
        await pilot.press(key)
        await pilot.pause()
        assert len(source.sent) == 1 and isinstance(source.sent[0], command)
        if hasattr(source.sent[0], "node_id"):
            assert source.sent[0].node_id == selected
        await app.pump()
        await pilot.pause()
        assert shown in screen_text(app)


async def test_pause_then_resume() -> None:
    source = SyntheticSource(10)
    app = make_app(source)
    async with app.run_test() as pilot:
        await pilot.press("p")
        await app.pump()
        await pilot.press("p")
        await app.pump()
        await pilot.pause()
        assert [type(c) for c in source.sent] == [Pause, Resume]
        assert "running" in screen_text(app)


async def test_ban_twice_unbans() -> None:
    source = SyntheticSource(10)
    app = make_app(source)
    async with app.run_test() as pilot:
        await pilot.press("b")
        await app.pump()
        await pilot.press("b")
        await pilot.pause()
        assert [c.banned for c in source.sent if isinstance(c, BanSubtree)] == [True, False]


async def test_hint_goes_through_the_input_screen() -> None:
    source = SyntheticSource(20)
    app = make_app(source)
    async with app.run_test() as pilot:
        selected = app.selected
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app.screen, HintScreen)
        await pilot.press(*"try 8 rows per block", "enter")
        await pilot.pause()
        assert source.sent == [AddHint(node_id=selected, text="try 8 rows per block", at=source.sent[0].at)]
        await app.pump()
        await pilot.pause()
        assert "hint recorded: try 8 rows per block" in screen_text(app)


async def test_escape_cancels_a_hint() -> None:
    source = SyntheticSource(20)
    app = make_app(source)
    async with app.run_test() as pilot:
        await pilot.press("h", "a", "escape")
        await pilot.pause()
        assert source.sent == []


async def test_edit_submits_the_kernel_as_a_child() -> None:
    source = SyntheticSource(20)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        selected = app.selected
        assert selected is not None
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, EditorScreen)
        assert app.screen.query_one("TextArea").language == "cuda"  # type: ignore[attr-defined]
        await pilot.press("ctrl+home", *"// hand tuned", "enter", "ctrl+s")
        await pilot.pause()
        (sent,) = source.sent
        assert isinstance(sent, InjectKernel) and sent.parent_id == selected
        assert sent.source.startswith("// hand tuned\n") and sent.plan.entry == "softmax_rows"
        await app.pump()
        await pilot.pause()
        assert "hand-written" in screen_text(app)
        assert len(app.state.nodes) == 21


async def test_an_unchanged_edit_sends_nothing() -> None:
    source = SyntheticSource(20)
    app = make_app(source)
    async with app.run_test() as pilot:
        await pilot.press("e")
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert source.sent == []


async def test_edit_external_reads_the_source_and_runs_the_editor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Headless, the terminal cannot be handed to an editor: the key still reads the source and says so."""
    monkeypatch.setenv("EDITOR", "true")
    source = SyntheticSource(20)
    app = make_app(source)
    notes: list[str] = []

    def hook(message: Message) -> None:
        if isinstance(message, Notify):
            notes.append(str(message.notification.message))

    async with app.run_test(message_hook=hook) as pilot:
        await pilot.press("E")
        await settle(app, pilot)
        assert [n for n in notes if n.startswith("Could not run true")]
        assert source.sent == []


class Terminal:
    """What `edit_externally` needs of an app: a terminal to hand over, and a way to say what went wrong."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def suspend(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def notify(self, message: str, **_: object) -> None:
        self.notes.append(message)


def test_the_external_editor_returns_the_edited_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setenv("EDITOR", """sh -c 'echo "// tuned" >> "$1"' sh""")
    assert edit_externally(terminal, 3, "kernel\n") == "kernel\n// tuned\n"  # type: ignore[arg-type]
    monkeypatch.setenv("EDITOR", "true")
    assert edit_externally(terminal, 3, "kernel\n") == "kernel\n"  # type: ignore[arg-type]  # unchanged: the app says so
    monkeypatch.setenv("EDITOR", "no-such-editor-here")
    assert edit_externally(terminal, 3, "kernel\n") is None  # type: ignore[arg-type]
    assert terminal.notes and terminal.notes[0].startswith("Could not run no-such-editor-here")


@pytest.mark.parametrize("action", STEERING_ACTIONS, ids=[a.id for a in STEERING_ACTIONS])
async def test_steering_keys_are_disabled_on_a_finished_run(action: Action) -> None:
    source = SyntheticSource(10, steerable=False, state="finished")
    app = make_app(source)
    async with app.run_test() as pilot:
        assert app.check_action(action.action, ()) is None  # disabled: shown dimmed, the key does nothing
        await pilot.press(action.key)
        await pilot.pause()
        assert source.sent == [] and app.screen is app.screen_stack[0]  # nothing sent, no hint or editor opened
        assert "finished" in screen_text(app)


async def test_steering_keys_turn_off_when_the_run_finishes_and_show_so() -> None:
    source = SyntheticSource(10)
    app = make_app(source)
    async with app.run_test() as pilot:
        footer = {b.binding.action: b.enabled for b in app.screen.active_bindings.values()}
        assert footer["pause_resume"] and footer["expand"]
        source.pending.append(StateChanged(state="finished", reason="iteration budget"))
        await app.pump()
        await pilot.pause()
        footer = {b.binding.action: b.enabled for b in app.screen.active_bindings.values()}
        assert not footer["pause_resume"] and not footer["expand"] and footer["jump_best"]
        await pilot.press("p", "x")
        await pilot.pause()
        assert source.sent == []


async def test_node_keys_are_disabled_until_a_node_is_selected() -> None:
    source = SyntheticSource(1)
    source.nodes.clear()
    source.sources.clear()
    app = make_app(source)
    async with app.run_test() as pilot:
        assert app.selected is None
        assert app.check_action("expand", ()) is None and app.check_action("pause_resume", ()) is True
        await pilot.press("x", "b")
        await pilot.pause()
        assert source.sent == []


async def test_store_reads_run_off_the_ui_thread() -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("down", "down", "d", "e")
        await settle(app, pilot)
        assert isinstance(app.screen, EditorScreen)
    ui = threading.main_thread()
    assert len(source.read_threads) >= 8  # the snapshot; evaluations, profiles and sources of three nodes
    assert all(thread is not ui for thread in source.read_threads)


async def test_metrics_follow_the_selection() -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        first = app.selected
        await pilot.press("up")
        await settle(app, pilot)
        assert app.selected != first
        shown = app.query_one(MetricsPane)._current
        assert shown is not None and shown[0].node.id == app.selected and shown[0].evaluation is not None


async def test_filters_and_jump_to_best() -> None:
    source = SyntheticSource(60)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        tree = app.query_one(SearchTree)
        await pilot.press("f")
        await pilot.pause()
        assert tree.filter_mode == "improving" and "only improving" in screen_text(app)
        shown = {n.data for n in tree.root.children}
        assert shown == set(tree.matching())
        assert all(app.state.is_improving(app.state.nodes[i]) for i in shown if i is not None)
        await pilot.press("f")
        await pilot.pause()
        failed = {n.data for n in tree.root.children}
        assert failed and all(app.state.nodes[i].status == "failed" for i in failed if i is not None)
        await pilot.press("home")
        await pilot.press("g")
        await pilot.pause()
        assert app.selected == app.state.best_id
        assert str(tree.filter_mode) == "all"  # the best node is no failure: jumping to it shows the whole tree
        assert tree.cursor_node is not None and tree.cursor_node.data == app.state.best_id


async def test_diff_base_and_layout() -> None:
    source = SyntheticSource(30)
    app = make_app(source)
    async with app.run_test(size=(160, 48)) as pilot:
        diff = app.query_one(DiffPane)
        await pilot.press("d")
        await settle(app, pilot)
        assert app.diff_base == "baseline" and f"Diff #{app.selected} vs baseline" in screen_text(app)
        await pilot.press("d")
        await settle(app, pilot)
        assert str(app.diff_base) == "best"
        assert "identical to best" in screen_text(app)  # the best node is selected
        await pilot.press("d", "s")
        await settle(app, pilot)
        assert diff.side_by_side and "side by side" in screen_text(app)


async def test_help_lists_every_binding_id() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for action in ACTIONS:
            assert action.id in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_every_action_is_in_the_command_palette() -> None:
    app = make_app()
    async with app.run_test():
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {a.help for a in ACTIONS} <= titles


async def test_palette_command_runs_the_action() -> None:
    source = SyntheticSource(10)
    app = make_app(source)
    async with app.run_test() as pilot:
        (pause,) = [c for c in app.get_system_commands(app.screen) if c.title == "Pause the search, or resume it"]
        await pause.callback()
        await pilot.pause()
        assert isinstance(source.sent[0], Pause)


async def test_keymap_from_settings_remaps_a_binding() -> None:
    source = SyntheticSource(10)
    app = make_app(source, keymap={"pause_resume": "y"})
    async with app.run_test() as pilot:
        await pilot.press("p")
        await pilot.pause()
        assert source.sent == []
        await pilot.press("y")
        await pilot.pause()
        assert isinstance(source.sent[0], Pause)


def test_unknown_keymap_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown binding ids"):
        TuiSettings(keymap={"no_such_action": "z"})


def test_a_key_the_keymap_gives_to_two_actions_is_refused() -> None:
    """z is the zoom key: giving it to pause as well would make a press run whichever is looked up first."""
    with pytest.raises(ValueError, match=r"keys bound to two actions by the keymap: z \(pause_resume and"):
        TuiSettings(keymap={"pause_resume": "z"})
    assert TuiSettings(keymap={"pause_resume": "z", "maximize": "Z"}).keymap["pause_resume"] == "z"


def test_keymap_and_theme_from_the_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    import os
    from pathlib import Path

    path = Path(os.environ["KERNELFORGE_CONFIG"])
    path.write_text('[tui]\ntheme = "light"\n[tui.keymap]\nstop = "ctrl+x"\n')
    settings = TuiSettings()
    assert settings.theme == "light" and settings.keymap == {"stop": "ctrl+x"}
    monkeypatch.setenv("KERNELFORGE_TUI__THEME", "ansi")
    assert TuiSettings().theme == "ansi"


@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast", "ansi"])
async def test_themes_load(theme: str) -> None:
    app = make_app(theme=theme)
    async with app.run_test():
        assert app.theme == f"kernelforge-{theme}"


def test_an_unknown_theme_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown theme"):
        make_app(theme="nope")


async def test_live_updates_arrive_in_batches() -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        source.grow(25, changes=10)
        await app.pump()
        await pilot.pause()
        assert len(app.state.nodes) == 65
        assert f"{len(app.state.nodes)} nodes" in screen_text(app)
        assert await source.poll_events() == []


async def test_no_animation_over_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.1 5555 10.0.0.2 22")
    app = make_app()
    async with app.run_test():
        assert app.ssh and app.animation_level == "none"


async def test_quit_detaches_from_a_store_source() -> None:
    source = SyntheticSource(10)
    app = make_app(source)
    async with app.run_test() as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert source.closed and source.sent == []


class InProcess(SyntheticSource):
    """A synthetic source whose search runs in this process until it is told to stop."""

    in_process = True

    def __init__(self) -> None:
        super().__init__(10)
        import asyncio

        self.stopped = asyncio.Event()
        self.ran = False

    async def send(self, command: object) -> None:
        await super().send(command)  # type: ignore[arg-type]
        if isinstance(command, Stop):
            self.stopped.set()

    async def run(self) -> None:
        self.ran = True
        await self.stopped.wait()  # finishes in-flight work, then returns
        self.steerable = False


async def test_quit_stops_an_in_process_search_cleanly_first() -> None:
    source = InProcess()
    app = make_app(source)
    async with app.run_test() as pilot:
        await pilot.pause()
        assert source.ran
        await pilot.press("q")
        await pilot.pause(0.2)
    assert isinstance(source.sent[-1], Stop) and source.stopped.is_set()
    assert app.return_code == 0


async def test_a_read_that_lands_after_its_pane_is_gone_is_dropped() -> None:
    """Store reads run in threads; one can answer while the app is closing and its panes are removed."""
    source = SyntheticSource(20)
    app = make_app(source)
    async with app.run_test() as pilot:
        await app.query_one(MetricsPane).remove()
        await app.query_one(DiffPane).remove()
        await pilot.press("down")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.is_running and app.return_code is None


def failed_node(source: SyntheticSource) -> int:
    return next(n.id for n in source.nodes.values() if n.status == "failed")


@pytest.mark.parametrize(("key", "action"), [("x", "expand"), ("n", "profile"), ("h", "hint")])
async def test_node_keys_are_disabled_on_a_failed_node(key: str, action: str) -> None:
    """A failed node gets no children and has nothing to profile: expand, profile and hint cannot act on it."""
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert app.check_action(action, ()) is True  # on the best node, they act
        failed = failed_node(source)
        assert app.query_one(SearchTree).select_id(failed)
        await settle(app, pilot)
        assert app.selected == failed
        assert app.check_action(action, ()) is None
        footer = {b.binding.action: b.enabled for b in app.screen.active_bindings.values()}
        assert not footer[action] and footer["edit"]  # shown dimmed; an edit of a failed kernel is still a child
        await pilot.press(key)
        await settle(app, pilot)
        assert source.sent == [] and app.screen is app.screen_stack[0]
        (command,) = [c for c in app.get_system_commands(app.screen) if c.title == BY_ID[action].help]
        assert f"not now: #{failed} " in command.help  # the palette says why


async def test_editor_is_disabled_on_a_read_only_run_and_the_palette_says_why() -> None:
    source = SyntheticSource(10, steerable=False, state="finished")
    app = make_app(source)
    async with app.run_test() as pilot:
        await settle(app, pilot)
        assert app.check_action("edit", ()) is None and app.check_action("edit_external", ()) is None
        await pilot.press("e")
        await settle(app, pilot)
        assert not isinstance(app.screen, EditorScreen)
        (command,) = [c for c in app.get_system_commands(app.screen) if c.title == BY_ID["edit"].help]
        assert "not now: the run is opened read-only or has ended" in command.help
        await command.callback()  # chosen from the palette anyway: still nothing opens
        await settle(app, pilot)
        assert not isinstance(app.screen, EditorScreen) and source.sent == []


def notes_of(notes: list[str]) -> Callable[[Message], None]:
    def hook(message: Message) -> None:
        if isinstance(message, Notify):
            notes.append(str(message.notification.message))

    return hook


async def test_an_unchanged_edit_says_so_and_the_editor_stays_open() -> None:
    source = SyntheticSource(20)
    app = make_app(source)
    notes: list[str] = []
    async with app.run_test(message_hook=notes_of(notes)) as pilot:
        await pilot.press("e")
        await settle(app, pilot)
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert source.sent == [] and isinstance(app.screen, EditorScreen)
        assert any(n.startswith(f"No change from #{app.selected}: nothing to submit") for n in notes)
        await pilot.press("escape")  # unchanged: closes at once
        await settle(app, pilot)
        assert not isinstance(app.screen, EditorScreen) and source.sent == []


async def test_esc_discards_a_changed_edit_only_when_pressed_twice() -> None:
    source = SyntheticSource(20)
    app = make_app(source)
    notes: list[str] = []
    async with app.run_test(message_hook=notes_of(notes)) as pilot:
        await pilot.press("e")
        await settle(app, pilot)
        await pilot.press("ctrl+home", *"// mine", "escape")
        await settle(app, pilot)
        assert isinstance(app.screen, EditorScreen) and any("esc again discards it" in n for n in notes)
        await pilot.press("escape")
        await settle(app, pilot)
        assert not isinstance(app.screen, EditorScreen) and source.sent == []


async def test_an_edit_the_run_can_no_longer_take_is_kept_in_the_editor_with_the_reason() -> None:
    """The run finishes while the editor is open: ctrl+s says why nothing was sent and keeps the text."""
    source = SyntheticSource(20)
    app = make_app(source)
    notes: list[str] = []
    async with app.run_test(message_hook=notes_of(notes)) as pilot:
        await pilot.press("e")
        await settle(app, pilot)
        source.pending.append(StateChanged(state="finished", reason="iteration budget"))
        await app.pump()
        await pilot.press("ctrl+home", *"// mine", "ctrl+s")
        await settle(app, pilot)
        assert source.sent == [] and isinstance(app.screen, EditorScreen)
        assert app.screen.query_one(TextArea).text.startswith("// mine")
        assert any(n.startswith("Not submitted: the run has finished.") for n in notes)


async def test_an_unchanged_external_edit_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tui_app, "edit_externally", lambda _app, _node, source: source)
    source = SyntheticSource(20)
    app = make_app(source)
    notes: list[str] = []
    async with app.run_test(message_hook=notes_of(notes)) as pilot:
        await pilot.press("E")
        await settle(app, pilot)
        assert source.sent == [] and any(n.startswith("No change from #") for n in notes)
        monkeypatch.setattr(tui_app, "edit_externally", lambda _app, _node, source: "// changed\n" + source)
        await pilot.press("E")
        await settle(app, pilot)
        assert isinstance(source.sent[-1], InjectKernel) and source.sent[-1].source.startswith("// changed")


async def test_the_log_shows_its_last_line_when_a_sideways_scroll_bar_takes_a_row() -> None:
    app = make_app(SyntheticSource(40))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        log = app.query_one(LogPane)
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y
        assert "templates tried: vector width 1 -> 4" in screen_text(app)  # the snapshot's last log line


async def test_a_pump_that_ends_after_the_widgets_are_gone_folds_nothing() -> None:
    """The app's pump reads its source (a thread hop for a store) while the app may be closing: the events that come
    back then are dropped, not folded into widgets that are gone (a closing app once failed on the missing tree)."""
    source = SyntheticSource(5)
    app = make_app(source)
    async with app.run_test() as pilot:
        await settle(app, pilot)
        await source.send(Pause())  # an event pending for the next pump
        await app.query_one(SearchTree).remove()
        await app.pump()
        assert not source.pending  # read, and dropped without an error
