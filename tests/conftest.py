"""Shared fixtures: isolated cache and data dirs, so tests never touch the user's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Cubin cache shared by the session (builds are slow), data and config per test."""
    monkeypatch.setenv("KERNELFORGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("KERNELFORGE_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    monkeypatch.setenv("KERNELFORGE_CONFIG", str(tmp_path_factory.mktemp("config") / "config.toml"))
    yield
