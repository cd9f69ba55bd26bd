"""TUI settings: the `[tui]` table of the kernelforge config file and `KERNELFORGE_TUI__*` variables."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from kernelforge_tui.config import FileSettings, checked_settings
from kernelforge_tui.tui.keymap import validate_keymap


class TuiSettings(FileSettings):
    """How the TUI looks and which keys it answers to (the config file's `[tui]` table)."""

    toml_table = ("tui",)

    model_config = SettingsConfigDict(env_prefix="KERNELFORGE_TUI__", env_nested_delimiter="__", extra="ignore")

    theme: str = "dark"
    """dark, light, high-contrast, ansi (or any Textual theme name, or one in the user themes folder)."""
    keymap: dict[str, str] = Field(default_factory=dict)
    """Binding id to keys (comma-separated), e.g. {"pause_resume": "space", "stop": "ctrl+x"}."""
    refresh_hz: float = Field(default=4.0, gt=0, le=30)
    """How often new events are folded into the panes."""
    ssh_refresh_hz: float = Field(default=2.0, gt=0, le=30)
    """The same over SSH (`SSH_CONNECTION` set): fewer, larger repaints."""

    @field_validator("keymap")
    @classmethod
    def _known_ids(cls, value: dict[str, str]) -> dict[str, str]:
        return validate_keymap(value)


def load_tui_settings(**overrides: Any) -> TuiSettings:
    return checked_settings(TuiSettings, "tui", **{k: v for k, v in overrides.items() if v is not None})
