"""A card no template serves says so in the TUI's header (live, and opened at rest), not only in a log line that
scrolls away: the search stops with "nothing to propose" and the header shows it beside the state."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.view import RunHeader
from kernelforge_tui.suite import cards, registry
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.launch import new_search, open_source
from kernelforge_tui.tui.source import LiveSearchSource
from tests.support.fakes.tui import screen_text, settle

SAID = "nothing to propose (the log says why)"


def header_line(app: KernelForgeApp) -> str:
    return screen_text(app).split("╭")[0]


async def test_the_header_says_a_card_no_template_serves_has_nothing_to_propose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unserved = dataclasses.replace(registry.task("vector_add"), name="tui_unserved", family="other")
    monkeypatch.setitem(registry.TASKS, unserved.name, unserved)
    card = cards.write(unserved, "float32", 2**10, tmp_path)
    search = new_search(card.root, Budget(max_iterations=3), simulate=True)
    app = KernelForgeApp(LiveSearchSource(search, search.store), TuiSettings(refresh_hz=10))
    async with app.run_test(size=(160, 40)) as pilot:
        deadline = time.monotonic() + 60
        while app.state.header.state != "finished":
            assert time.monotonic() < deadline, "the search did not finish"
            await pilot.pause(0.2)
        await settle(app, pilot)
        assert SAID in header_line(app)
        assert "has no template for family other" in screen_text(app)  # the log line with the reason
        await pilot.press("q")
    run_dir = search.store.run_dir
    search.store.close()

    at_rest = KernelForgeApp(open_source(str(run_dir)), TuiSettings(refresh_hz=10))
    async with at_rest.run_test(size=(160, 40)) as pilot:
        await settle(at_rest, pilot)
        assert SAID in header_line(at_rest)


def test_only_a_proposer_with_nothing_is_called_out() -> None:
    assert RunHeader(reason="nothing to propose: the templates proposer has no template").nothing_to_propose
    assert not RunHeader(reason="iteration budget reached (3 of 3)").nothing_to_propose
