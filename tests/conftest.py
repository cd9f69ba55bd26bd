"""Shared fixtures: isolated cache and data dirs, so tests never touch the user's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .gpu_harness import Harness

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Cubin cache shared by the session (builds are slow), data and config per test."""
    monkeypatch.setenv("KERNELFORGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("KERNELFORGE_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    monkeypatch.setenv("KERNELFORGE_CONFIG", str(tmp_path_factory.mktemp("config") / "config.toml"))
    yield


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for a GPU test module, so its evaluators (and their workers) live across tests."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def harness(loop: asyncio.AbstractEventLoop) -> Iterator[Harness]:
    from .gpu_harness import Harness

    h = Harness(loop)
    yield h
    h.close()
