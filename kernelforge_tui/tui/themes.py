"""Themes as data: TOML files loaded into `textual.theme.Theme`.

The shipped themes are the repository's top-level `themes/`; the wheel carries them as
`kernelforge_tui/themes` (hatch force-include), and `shipped_themes_dir` finds them in either layout. A user
adds a theme, or replaces a shipped one, with a TOML file in the `themes/` folder beside the config file
(`~/.config/kernelforge-tui/themes/` by default).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path

from textual.theme import Theme

from kernelforge_tui.config import config_file
from kernelforge_tui.errors import BadInput

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
PACKAGE = Path(__file__).resolve().parent.parent


class ThemeError(BadInput, ValueError):
    """A theme that cannot be used: unknown by name, or a theme file that does not read as one."""


def shipped_themes_dir(package: Path = PACKAGE) -> Path:
    """`themes/` inside the installed package (the wheel's layout), else beside it (a checkout's)."""
    for candidate in (package / "themes", package.parent / "themes"):
        if candidate.is_dir():
            return candidate
    raise ThemeError(f"no shipped themes in {package / 'themes'} or {package.parent / 'themes'}: reinstall kernelforge")


def user_themes_dir() -> Path:
    """The user's own themes: `themes/` beside the config file (which `KERNELFORGE_CONFIG` may move)."""
    return config_file().parent / "themes"


def theme_from_file(path: Path) -> Theme:
    try:
        data = tomllib.loads(path.read_text())
        unknown = set(data) - set(THEME_FIELDS)
        if unknown:
            raise ValueError(f"unknown fields {', '.join(sorted(unknown))} (known: {', '.join(THEME_FIELDS)})")
        return Theme(**data)
    except (OSError, ValueError, TypeError) as exc:  # TOMLDecodeError is a ValueError; TypeError: a field missing
        raise ThemeError(f"{path}: not a usable theme: {exc}") from None


def _themes_in(folder: Path) -> Iterable[Theme]:
    return (theme_from_file(path) for path in sorted(folder.glob("*.toml")))


def load_themes() -> list[Theme]:
    """The shipped themes, then the user's (a user theme with a shipped name replaces it)."""
    found = {theme.name: theme for theme in _themes_in(shipped_themes_dir())}
    user = user_themes_dir()
    if user.is_dir():
        found.update((theme.name, theme) for theme in _themes_in(user))
    return list(found.values())


def resolve_theme(name: str, available: Iterable[str]) -> str:
    """The registered name for `name` (`dark` is `kernelforge-dark`); an unknown one is an error."""
    resolved = ALIASES.get(name, name)
    if resolved not in available:
        raise ThemeError(
            f"unknown theme {name!r}: use one of {', '.join(ALIASES)}, a Textual theme, or a TOML file in "
            f"{user_themes_dir()}"
        )
    return resolved
