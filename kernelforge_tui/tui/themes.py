"""Themes as data: TOML files loaded into `textual.theme.Theme`.

The shipped ones live in `kernelforge_tui/themes/` (inside the package, so the wheel carries them);
a user adds or overrides one by dropping a TOML file in `<config dir>/kernelforge-tui/themes/`.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import platformdirs
from textual.theme import Theme

from kernelforge_tui.config import APP_NAME

ALIASES = {
    "dark": "kernelforge-dark",
    "light": "kernelforge-light",
    "high-contrast": "kernelforge-high-contrast",
    "ansi": "kernelforge-ansi",
}
THEME_FIELDS = (
    "name",
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
    "dark",
    "luminosity_spread",
    "text_alpha",
    "variables",
    "ansi",
)


def theme_from_toml(data: dict[str, Any]) -> Theme:
    unknown = set(data) - set(THEME_FIELDS)
    if unknown:
        raise ValueError(f"unknown theme fields: {', '.join(sorted(unknown))}")
    return Theme(**data)


def user_themes_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME)) / "themes"


def load_themes() -> list[Theme]:
    """The shipped themes, then the user's (a user theme with a shipped name replaces it)."""
    found: dict[str, Theme] = {}
    shipped = resources.files("kernelforge_tui") / "themes"
    for entry in sorted(shipped.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            theme = theme_from_toml(tomllib.loads(entry.read_text()))
            found[theme.name] = theme
    user = user_themes_dir()
    if user.is_dir():
        for path in sorted(user.glob("*.toml")):
            try:
                theme = theme_from_toml(tomllib.loads(path.read_text()))
            except (ValueError, TypeError, tomllib.TOMLDecodeError):
                continue
            found[theme.name] = theme
    return list(found.values())


def resolve_theme_name(name: str) -> str:
    return ALIASES.get(name, name)
