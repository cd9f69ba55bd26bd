"""A diff a person can read: the changed hunks with context and folds, code that scrolls sideways instead of being
cut (both sides of a side-by-side diff together), a pane that can take the whole screen and give it back, a layout
that gives the code most of a wide terminal, and a help screen that scrolls on a short one."""

from __future__ import annotations

import pytest
from textual.widgets import Footer

from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.screens import HelpScreen
from kernelforge_tui.tui.widgets import DiffPane, LogPane, MetricsPane, SearchTree
from kernelforge_tui.tui.widgets.diff import CONTEXT, DiffRow, diff_rows
from tests.support.fakes.synthetic import SyntheticSource, kernel_source
from tests.support.fakes.tui import screen_text, settle

OLD = [f"line {i}" for i in range(40)]
NEW = [*OLD[:10], "changed 10", *OLD[11:30], "added", *OLD[30:]]


def make_app(source: SyntheticSource | None = None, **settings: object) -> KernelForgeApp:
    return KernelForgeApp(source or SyntheticSource(40), TuiSettings(**settings))  # type: ignore[arg-type]


def test_only_the_changed_hunks_show_with_context_and_the_rest_is_folded() -> None:
    rows = diff_rows(OLD, NEW, side_by_side=False)
    kinds = [r.kind for r in rows]
    assert kinds.count("removed") == 1 and kinds.count("added") == 2
    folds = [r for r in rows if r.kind == "fold"]
    # Before the first change, between the two changes, after the last: each leaves CONTEXT lines next to a change.
    assert [f.hidden for f in folds] == [10 - CONTEXT, 30 - 11 - 2 * CONTEXT, 40 - 30 - CONTEXT]
    assert sum(f.hidden for f in folds) + kinds.count("same") == len(OLD) - 1
    first_change = kinds.index("removed")
    assert kinds[first_change - CONTEXT : first_change] == ["same"] * CONTEXT  # context right above it
    assert rows[0] == DiffRow("fold", 0, 0, hidden=10 - CONTEXT)


def test_unfolded_every_line_shows_and_a_tiny_gap_is_not_folded() -> None:
    rows = diff_rows(OLD, NEW, side_by_side=False, context=None)
    assert not [r for r in rows if r.kind == "fold"] and len([r for r in rows if r.kind == "same"]) == len(OLD) - 1
    near = [*OLD[:5], "a", *OLD[6:12], "b", *OLD[13:]]  # 6 unchanged lines between: 3 + 3 of context, no fold
    between = diff_rows(OLD, near, side_by_side=False)
    kinds = [r.kind for r in between]
    assert kinds[kinds.index("added") + 1 : kinds.index("added") + 7] == ["same"] * 6


def test_side_by_side_pairs_removed_and_added_lines_on_one_row() -> None:
    rows = diff_rows(["a", "b", "c"], ["a", "B", "B2", "c"], side_by_side=True)
    assert [(r.kind, r.old, r.new) for r in rows] == [
        ("same", 0, 0),
        ("changed", 1, 1),
        ("changed", None, 2),
        ("same", 2, 3),
    ]


async def test_long_lines_scroll_sideways_instead_of_being_cut() -> None:
    source = SyntheticSource(40)
    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        diff = app.query_one(DiffPane)
        diff.folded = False
        await settle(app, pilot)
        tail = "int cols) {"  # the end of the kernel's signature, far right of a 44-column pane
        assert tail in kernel_source(256, 8, False) and tail not in screen_text(app)
        assert diff.max_scroll_x > 0  # the pane knows the code is wider than itself
        diff.focus()
        await pilot.press("end")  # to the bottom ...
        await pilot.press("home")  # ... and back: both keys scroll, neither cuts
        for _ in range(diff.max_scroll_x):
            await pilot.press("right")
        await settle(app, pilot)
        assert diff.scroll_x == diff.max_scroll_x
        text = screen_text(app)
        assert tail in text  # the end of the line, reached by scrolling
        assert " 4 " in text  # its line number stays put while the code scrolls


async def test_side_by_side_sides_scroll_together_and_number_their_lines() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        diff = app.query_one(DiffPane)
        await pilot.press("s")
        await settle(app, pilot)
        assert diff.side_by_side and "side by side" in screen_text(app)
        assert diff.rows[0].kind == "names" and any(r.kind == "changed" for r in diff.rows)
        assert diff.max_scroll_x > 0
        line = "// Row softmax: one block per row,"
        assert screen_text(app).count(line) == 2  # the changed comment, once a side
        diff.scroll_to(x=diff.max_scroll_x, animate=False)
        await settle(app, pilot)
        text = screen_text(app)
        assert line not in text  # both sides moved right together: the end of the signature shows on each
        assert text.count("int cols) {") == 2 and text.count(" 4 ") >= 2  # with their line numbers, unmoved


async def test_o_unfolds_the_whole_file_and_folds_it_again() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        diff = app.query_one(DiffPane)
        folded = len(diff.rows)
        assert any(r.kind == "fold" for r in diff.rows) and "changed hunks" in screen_text(app)
        await pilot.press("o")
        await settle(app, pilot)
        assert not diff.folded and not any(r.kind == "fold" for r in diff.rows) and len(diff.rows) > folded
        assert "whole file" in screen_text(app)
        await pilot.press("o")
        await settle(app, pilot)
        assert len(diff.rows) == folded


async def test_a_diff_that_fits_is_not_folded_and_folds_come_with_a_smaller_pane() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        diff = app.query_one(DiffPane)
        assert diff.folded and not any(r.kind == "fold" for r in diff.rows)  # 27 lines in a 40-line pane
        assert "whole diff (fits)" in screen_text(app)
        await pilot.resize_terminal(160, 24)
        await settle(app, pilot)
        assert any(r.kind == "fold" for r in diff.rows) and "changed hunks" in screen_text(app)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
async def test_z_maximises_the_focused_pane_and_restores_it(size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        diff = app.query_one(DiffPane)
        normal = diff.size.width
        diff.focus()
        await pilot.press("z")
        await settle(app, pilot)
        assert app.screen.maximized is diff
        assert diff.outer_size.width == size[0] and diff.outer_size.height == size[1] - 2  # all but header, footer
        assert not app.query_one(SearchTree).display or app.query_one(SearchTree).region.area == 0
        assert app.query_one(Footer).region.area > 0  # the keys stay on screen
        await pilot.press("z")
        await settle(app, pilot)
        assert app.screen.maximized is None and diff.size.width == normal
        for pane in (app.query_one(LogPane), app.query_one(MetricsPane), app.query_one(SearchTree)):
            pane.focus()
            await pilot.press("z")
            await settle(app, pilot)
            assert app.screen.maximized is pane and pane.outer_size.width == size[0]
            await pilot.press("escape")  # esc restores too
            await settle(app, pilot)
            assert app.screen.maximized is None


async def test_maximise_is_remappable_and_in_the_palette() -> None:
    app = make_app(keymap={"maximize": "ctrl+o"})
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("z")
        await settle(app, pilot)
        assert app.screen.maximized is None  # z no longer maximises
        await pilot.press("ctrl+o")
        await settle(app, pilot)
        assert app.screen.maximized is app.query_one(SearchTree)  # the focused pane
        (command,) = [c for c in app.get_system_commands(app.screen) if c.title.startswith("Maximise the focused")]
        assert "key ctrl+o · binding id maximize" in command.help
        await command.callback()
        await settle(app, pilot)
        assert app.screen.maximized is None


async def test_a_wide_terminal_gives_the_code_most_of_the_width() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        diff, tree, metrics = app.query_one(DiffPane), app.query_one(SearchTree), app.query_one(MetricsPane)
        assert diff.outer_size.width >= 0.6 * 160
        assert diff.outer_size.height > tree.outer_size.height  # the whole height of its column
        assert metrics.region.x == tree.region.x and metrics.region.y > tree.region.y  # under the tree
    narrow = make_app()
    async with narrow.run_test(size=(80, 24)) as pilot:
        await settle(narrow, pilot)
        diff, tree, metrics = narrow.query_one(DiffPane), narrow.query_one(SearchTree), narrow.query_one(MetricsPane)
        assert tree.outer_size.width == 80 and diff.region.y > tree.region.y  # the tree on top, the whole width
        assert diff.outer_size.width >= 0.55 * 80 and diff.outer_size.height >= 9  # beside the metrics, below it
        assert metrics.region.y == diff.region.y and metrics.region.x > diff.region.x


async def test_the_help_scrolls_on_a_short_terminal() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await settle(app, pilot)
        assert isinstance(app.screen, HelpScreen)
        last = "Glyphs: ○ proposed"
        assert last not in screen_text(app)  # cut at 80x24 ...
        await pilot.press("end")
        await settle(app, pilot)
        assert last in screen_text(app)  # ... and reached with the keys
