"""Themes people can read: every run of text drawn on the screens of the TUI, against the background it is drawn
on, reaches WCAG AA (4.5:1) in the dark, light and high-contrast themes; labels are dimmer than the values they
name and still read; and switching theme keeps the tree as it was.

What is checked is what the terminal is told to draw (the SVG screenshot: each run's colour and the background
cell under it), over the screens a person meets (tests/support/fakes/screens.py, drawn once per theme for these tests
and the snapshot tests): the main screen wide and narrow, with a profiled node, the diff side by side and whole, a
finished run's dimmed keys, the help, the hint, export and chart screens, zoomed panes and the editor. Not text, and so
not held to 4.5:1: box drawing (borders, tree guides), block elements (scroll bars, bars and charts), which WCAG counts
as graphics.

The `ansi` theme draws in the terminal's own palette, whose colours only the user's terminal knows, so no ratio
can be computed. What is checked there instead: every colour drawn is a palette colour or the terminal's default
(so the user's palette, tuned for their background, decides), no text shares its background's colour, and on the
terminal's default background no text is drawn in black, white, bright black or bright white (each vanishes on a
dark or a light terminal, or on Solarized, whose bright black is its background).
"""

from __future__ import annotations

import pytest
from rich.color import Color as RichColor
from rich.color_triplet import ColorTriplet
from rich.terminal_theme import SVG_EXPORT_THEME
from textual.color import Color

from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.contrast import AA, contrast, luminance, readable
from kernelforge_tui.tui.widgets import MetricsPane, SearchTree
from tests.support.fakes.screens import Drawing, drawings, group, themed
from tests.support.fakes.synthetic import SyntheticSource
from tests.support.fakes.tui import SVG_DEFAULT_BACKGROUND, Drawn, drawn, settle

GRAPHICS = {chr(c) for c in range(0x2500, 0x25A0)} | {" "}
"""Box drawing and block elements: borders, guides, scroll bars, bars and charts."""


def is_text(run: Drawn) -> bool:
    return not set(run.text) <= GRAPHICS


def hex_color(text: str) -> Color:
    return Color.parse(text)


def on_top(drawing: Drawing) -> list[Drawn]:
    """The runs a dialog draws: a modal screen dims the screen beneath, which is inactive while it is open (WCAG
    holds no inactive part of a page to its ratios)."""
    runs = drawn(drawing.svg)
    box = drawing.dialog
    if box is None:
        return runs
    return [r for r in runs if box.y <= r.row < box.bottom and box.x <= r.col < box.right]


def screens(theme: str) -> dict[str, list[Drawn]]:
    """What each screen draws, by name."""
    return {name: on_top(drawing) for name, drawing in drawings(theme).items()}


@pytest.mark.parametrize("theme", themed("dark", "light", "high-contrast"))
def test_every_text_on_every_screen_reads_at_wcag_aa(theme: str) -> None:
    shown = screens(theme)
    failures = sorted(
        {
            (name, run.text.strip()[:40], run.fg, run.bg, round(contrast(hex_color(run.fg), hex_color(run.bg)), 2))
            for name, runs in shown.items()
            for run in runs
            if is_text(run) and contrast(hex_color(run.fg), hex_color(run.bg)) < AA
        }
    )
    assert sum(len(runs) for runs in shown.values()) > 1000  # the screens were drawn, text and all
    assert not failures, "\n".join(map(str, failures))


def _palette() -> dict[str, str]:
    """Hex -> palette name, as Rich's SVG export draws the 16 colours and the default pair."""
    names = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]
    names += [f"bright_{n}" for n in names]
    theme = SVG_EXPORT_THEME
    out = {
        RichColor.from_triplet(ColorTriplet(*c)).get_truecolor().hex.lower(): n
        for c, n in zip([theme.ansi_colors[i] for i in range(16)], names, strict=True)
    }
    out[theme.foreground_color.hex.lower()] = "default"
    out[SVG_DEFAULT_BACKGROUND] = "default background"
    return out


def _dimmed(palette: dict[str, str]) -> dict[str, str]:
    """Rich draws dim text as the colour blended 40% toward the background: still the palette's colour."""
    out: dict[str, str] = {}
    for fg, name in palette.items():
        for bg in palette:
            blended = hex_color(fg).blend(hex_color(bg), 0.4).hex.lower()
            out.setdefault(blended, f"dim {name}")
    return out


@group("ansi")
def test_the_ansi_theme_draws_only_in_the_terminals_palette_and_never_in_its_background() -> None:
    palette = _palette()
    dimmed = _dimmed(palette)
    shown = screens("ansi")
    vanishing = {"black", "white", "bright_black", "bright_white"}
    problems = []
    for name, runs in shown.items():
        for run in runs:
            fg, bg = run.fg.lower(), run.bg.lower()
            fg_name = palette.get(fg) or dimmed.get(fg)
            if fg_name is None or bg not in palette:
                problems.append((name, run.text[:30], fg, bg, "not a palette colour"))
            elif is_text(run) and fg == bg:
                problems.append((name, run.text[:30], fg, bg, "text in its background's colour"))
            elif is_text(run) and bg == SVG_DEFAULT_BACKGROUND and fg_name.removeprefix("dim ") in vanishing:
                problems.append((name, run.text[:30], fg_name, bg, "vanishes on a dark or a light terminal"))
    assert sum(len(runs) for runs in shown.values()) > 1000
    assert not problems, "\n".join(map(str, sorted(set(problems))))


@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
async def test_labels_are_dimmer_than_values_and_still_read(theme: str) -> None:
    app = KernelForgeApp(SyntheticSource(40), TuiSettings(theme=theme))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        metrics = app.query_one(MetricsPane)
        background = metrics.rich_style.bgcolor
        value = metrics.rich_style.color
        label = metrics.get_component_rich_style("metrics-pane--label", partial=True).color
        assert background is not None and value is not None and label is not None
        bg, fg, muted = (Color.from_rich_color(c) for c in (background, value, label))
        assert contrast(fg, bg) > contrast(muted, bg) >= AA  # dimmer than the value, and still AA
        variables = app.get_css_variables()
        disabled = Color.parse(variables["text-disabled"])
        assert contrast(muted, bg) > contrast(disabled, bg) >= AA  # failed nodes dimmer still


def test_readable_moves_a_colour_just_enough() -> None:
    dark_bg, light_bg = Color.parse("#151B22"), Color.parse("#F0F2F5")
    comment = Color.parse("#6A737D")  # github_light's comment colour: 4.3:1 on the light surface
    fixed = readable(comment, light_bg)
    assert contrast(fixed, light_bg) >= AA and luminance(fixed) < luminance(comment)  # darker, on a light ground
    assert contrast(fixed, light_bg) < AA + 0.2  # no more than it takes
    assert readable(Color.parse("#D8DEE9"), dark_bg) == Color.parse("#D8DEE9")  # already fine: unchanged
    assert contrast(readable(Color.parse("#3FCF8E"), Color.parse("#3FCF8E")), Color.parse("#3FCF8E")) >= AA


async def test_switching_theme_from_the_palette_keeps_the_tree() -> None:
    """Expanded and collapsed nodes, the selection and the scroll survive a theme switch made in the command
    palette (its theme picker, typed and chosen as a person would)."""
    app = KernelForgeApp(SyntheticSource(200), TuiSettings(theme="dark"))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        tree = app.query_one(SearchTree)
        await pilot.press("home", "down", "down", "down", "space", "down", "down", "space")
        await settle(app, pilot)

        def shape() -> tuple[list[tuple[int | None, bool]], int | None, int]:
            nodes = [(n.data, n.is_expanded) for n in tree.root.children]
            nodes += [(c.data, c.is_expanded) for n in tree.root.children for c in n.children]
            return nodes, tree.cursor_node.data if tree.cursor_node else None, tree.scroll_offset.y

        before = shape()
        selected = app.selected
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"theme", "enter")
        await pilot.pause()
        await pilot.press(*"kernelforge-light", "enter")
        await settle(app, pilot)
        assert app.theme == "kernelforge-light"
        assert shape() == before and app.selected == selected
