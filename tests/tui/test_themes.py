"""Themes: shipped from the repository's top-level `themes/`, found the same way from a checkout and from
an installed wheel, and a user's own themes beside their config file."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.themes import ThemeError, load_themes, shipped_themes_dir, user_themes_dir
from tests.conftest import ROOT
from tests.support.fakes.synthetic import SyntheticSource

SHIPPED = {"kernelforge-dark", "kernelforge-light", "kernelforge-high-contrast", "kernelforge-ansi"}


def test_a_checkout_finds_the_top_level_themes() -> None:
    assert shipped_themes_dir() == ROOT / "themes"
    assert {theme.name for theme in load_themes()} >= SHIPPED


def test_the_wheel_carries_the_themes_and_an_install_finds_them(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("kernelforge_tui-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    assert {f"kernelforge_tui/themes/{name}.toml" for name in ("dark", "light", "high-contrast", "ansi")} <= names
    code = (
        "import kernelforge_tui.tui.themes as t; "
        "print(t.shipped_themes_dir()); print(sorted(theme.name for theme in t.load_themes()))"
    )
    env = os.environ | {"PYTHONPATH": str(tmp_path / "site")}
    found = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr[-2000:]
    where, names_line = found.stdout.splitlines()
    assert Path(where) == tmp_path / "site" / "kernelforge_tui" / "themes"
    assert all(name in names_line for name in SHIPPED)


def test_a_users_theme_beside_the_config_file_is_picked_up() -> None:
    folder = user_themes_dir()
    assert folder == Path(os.environ["KERNELFORGE_CONFIG"]).parent / "themes"  # the test's own config dir
    folder.mkdir(parents=True)
    (folder / "mine.toml").write_text('name = "mine"\nprimary = "#ff8800"\ndark = true\n')
    (folder / "light.toml").write_text('name = "kernelforge-light"\nprimary = "#123456"\ndark = false\n')
    themes = {theme.name: theme for theme in load_themes()}
    assert themes["kernelforge-light"].primary == "#123456"  # a user theme replaces a shipped one by name
    app = KernelForgeApp(SyntheticSource(5), TuiSettings(theme="mine"))
    assert app.theme == "mine"


def test_a_broken_user_theme_is_an_error_naming_the_file() -> None:
    folder = user_themes_dir()
    folder.mkdir(parents=True)
    (folder / "bad.toml").write_text('name = "bad"\nprimary = "#ff8800"\nshade = 3\n')
    with pytest.raises(ThemeError, match=r"bad\.toml: not a usable theme: unknown fields shade"):
        load_themes()


def test_an_unknown_theme_is_an_error() -> None:
    with pytest.raises(ThemeError, match="unknown theme 'nope'"):
        KernelForgeApp(SyntheticSource(5), TuiSettings(theme="nope"))
