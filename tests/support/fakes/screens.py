"""The screens of the TUI a person meets, each theme's drawn once for the snapshot and the contrast tests.

The snapshot tests compare a theme's screens with the reviewed SVGs and the contrast tests read the colours of the
same drawings, so a screen is drawn once per theme, not once per test, and each by one app a terminal size (an
app's start costs more than the screens it draws): every screen is opened from the main screen and its way back
must draw that main screen again exactly (checked), so each is drawn as a fresh app given the same keys draws it.
The drawings are SVG screenshots as pytest-textual-snapshot takes them (the app's title, simplified segments, tooltips
and notifications on), each session in an event loop of its own as each snapshot's app was: drawn so, every screen is
the reviewed SVG byte for byte.

The tests that use them are grouped by theme (`themed`, run with `--dist loadgroup`), so that under xdist one worker
draws a theme's screens and the others never do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from textual.geometry import Region
from textual.pilot import Pilot
from textual.screen import ModalScreen
from textual.widgets import Input

from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.widgets import MetricsPane, SearchTree
from tests.support.fakes.synthetic import SyntheticSource
from tests.support.fakes.tui import drawn, settle

Step = Callable[[KernelForgeApp, Pilot[None]], Awaitable[None]]
SNAPSHOT_THEMES = frozenset({"dark", "light"})
"""The themes the snapshot tests hold every screen of; the contrast tests read every theme's screens."""


def group(theme: str) -> pytest.MarkDecorator:
    """The xdist group of the tests that read `theme`'s screens: one worker draws them."""
    return pytest.mark.xdist_group(f"screens-{theme}")


def themed(*themes: str) -> list[object]:
    """Theme parameters, each in its theme's group."""
    return [pytest.param(theme, marks=group(theme)) for theme in themes]


def press(*keys: str) -> Step:
    """A step that presses the keys, then waits for the app's reads."""

    async def step(app: KernelForgeApp, pilot: Pilot[None]) -> None:
        await pilot.press(*keys)
        await settle(app, pilot)

    return step


async def select_profiled(app: KernelForgeApp, pilot: Pilot[None]) -> None:
    profiled = next(n.id for n in app.state.nodes.values() if n.status == "profiled")
    app.query_one(SearchTree).select_id(profiled)
    await settle(app, pilot)


async def zoom_metrics(app: KernelForgeApp, pilot: Pilot[None]) -> None:
    app.query_one(MetricsPane).focus()
    await press("z")(app, pilot)


async def export_prompt(app: KernelForgeApp, pilot: Pilot[None]) -> None:
    await press("m")(app, pilot)
    app.screen.query_one(Input).cursor_blink = False  # nothing blinks in a drawing


@dataclass(frozen=True)
class Drawing:
    svg: str
    dialog: Region | None
    """The box a dialog (a modal screen) draws; the screen beneath it is dimmed and inactive while it is open."""


def drawing_of(app: KernelForgeApp) -> Drawing:
    """What `app` draws now, with the box of the dialog on top if one is open."""
    dialog = app.screen.children[0].region if isinstance(app.screen, ModalScreen) else None
    return Drawing(app.export_screenshot(title=app.title, simplify=True), dialog)


@dataclass(frozen=True)
class Screen:
    name: str
    open: Step
    """From the main screen, or from the screen before when that one has no way back."""
    back: Step | None
    """Back to the main screen (None: the next screen goes on from this one, or it is the session's last)."""
    themes: frozenset[str] | None = None
    """Drawn in these themes only (None: every theme); only a screen with a way back, or the last ones, is left out."""


@dataclass(frozen=True)
class Session:
    """One app at one terminal size: its main screen (kept under `main`, unless None), then its screens."""

    size: tuple[int, int]
    main: str | None
    screens: tuple[Screen, ...] = ()
    themes: frozenset[str] | None = None
    finished: bool = False
    """A finished run, which nothing can steer (its keys dimmed)."""


SESSIONS = (
    Session(
        (160, 48),
        "main 160x48",
        (
            Screen("side by side", press("s"), press("s")),
            Screen("whole file", press("o"), press("o")),
            Screen("zoomed diff 160x48", press("tab", "z"), press("z", "shift+tab"), SNAPSHOT_THEMES),
            Screen("chart 160x48", press("v"), press("escape"), SNAPSHOT_THEMES),
            Screen("export 160x48", export_prompt, press("escape"), frozenset({"light"})),
            Screen("profiled node", select_profiled, None),  # the selection moves: no way back
            Screen("metrics zoomed 160x48", zoom_metrics, None, SNAPSHOT_THEMES),
        ),
    ),
    Session((160, 48), None, (Screen("failures", press("f", "f"), None),)),  # the filter moves the selection
    Session(
        (160, 48),
        None,
        (Screen("whole file side by side scrolled sideways", press("s", "o", "tab", *["right"] * 30), None),),
        frozenset({"dark"}),
    ),
    Session(
        (80, 24),
        "main 80x24",
        (
            Screen("zoomed diff 80x24", press("tab", "z"), press("z", "shift+tab")),
            Screen("chart 80x24", press("v"), press("escape"), SNAPSHOT_THEMES),
            Screen("export 80x24", export_prompt, press("escape"), frozenset({"dark"})),
            Screen("help 80x24", press("question_mark"), None),
            Screen("help end 80x24", press("end"), press("escape")),
            Screen("profiled node 80x24", select_profiled, None, SNAPSHOT_THEMES),
            Screen("metrics zoomed 80x24", zoom_metrics, None, SNAPSHOT_THEMES),
        ),
    ),
    Session(
        (100, 30),
        None,
        (
            Screen("chart", press("v"), press("escape")),
            Screen("hint", press("h"), press("escape")),
            Screen("export", export_prompt, press("escape")),
            Screen("editor", press("e"), press("escape")),
        ),
    ),
    Session((100, 36), None, (Screen("help 100x36", press("question_mark"), None),), frozenset({"dark"})),
    Session((160, 48), "finished run", finished=True),
)


def new_app(theme: str, finished: bool = False) -> KernelForgeApp:
    """The seeded synthetic run (fixed timestamps, times shown relative to the run's start) in `theme`."""
    run = Path("/runs/r-2311-softmax")
    source = SyntheticSource(40, steerable=False, state="finished", run_dir=run) if finished else None
    return KernelForgeApp(source or SyntheticSource(40, run_dir=run), TuiSettings(theme=theme))


def _shown(themes: frozenset[str] | None, theme: str) -> bool:
    return themes is None or theme in themes


async def _draw(theme: str, session: Session) -> dict[str, Drawing]:
    out: dict[str, Drawing] = {}
    app = new_app(theme, session.finished)
    async with app.run_test(size=session.size, tooltips=True, notifications=True) as pilot:
        await settle(app, pilot)
        start = drawing_of(app)
        if session.main is not None:
            out[session.main] = start
        for screen in (s for s in session.screens if _shown(s.themes, theme)):
            await screen.open(app, pilot)
            out[screen.name] = drawing_of(app)
            if screen.back is not None:
                await screen.back(app, pilot)
                again = drawn(drawing_of(app).svg)
                assert again == drawn(start.svg), f"{theme}: the way back from {screen.name!r} changed the screen"
    return out


@cache
def drawings(theme: str) -> dict[str, Drawing]:
    """Every screen `theme` shows, by name: drawn at the first call in this process (called from a test that is not
    a coroutine: each session runs in an event loop of its own)."""
    out: dict[str, Drawing] = {}
    for session in (s for s in SESSIONS if _shown(s.themes, theme)):
        out |= asyncio.run(_draw(theme, session))
    return out
