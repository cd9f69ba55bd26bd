"""Helpers for driving the TUI in tests: what the screen says, and waiting for the app's reads."""

from __future__ import annotations

import html
import re

from textual.pilot import Pilot

from kernelforge_tui.tui.app import KernelForgeApp


def screen_text(app: KernelForgeApp) -> str:
    """What the terminal shows, as plain text (from the SVG screenshot, a public API)."""
    svg = app.export_screenshot()
    lines = re.findall(r"<text[^>]*>(.*?)</text>", svg)
    return html.unescape("".join(lines)).replace("\xa0", " ")


async def settle(app: KernelForgeApp, pilot: Pilot[None]) -> None:
    """Wait for the app's reads from its source (thread workers; not the engine), then for the screen."""
    await pilot.pause()
    await app.workers.wait_for_complete([w for w in app.workers if w.group != "engine"])
    await pilot.pause()
