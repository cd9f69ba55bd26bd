"""Settings: one pydantic model read from a TOML file and `KERNELFORGE_*` environment variables.

Why one model: every command (CLI, TUI, worker) reads the same paths and limits, so a user sets them
once, in `~/.config/kernelforge-tui/config.toml` or the environment (`KERNELFORGE_GPU__ARCH=sm_90`).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

APP_NAME = "kernelforge-tui"


def cache_dir() -> Path:
    """Where compiled cubins and measured ceilings live (safe to delete)."""
    return Path(os.environ.get("KERNELFORGE_CACHE_DIR") or platformdirs.user_cache_dir(APP_NAME))


def data_dir() -> Path:
    """Where runs (one SQLite store each) live by default."""
    return Path(os.environ.get("KERNELFORGE_DATA_DIR") or platformdirs.user_data_dir(APP_NAME))


def config_file() -> Path:
    """The user's TOML settings file (optional); `KERNELFORGE_CONFIG` names another one."""
    explicit = os.environ.get("KERNELFORGE_CONFIG")
    return Path(explicit) if explicit else Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


class BuildSettings(BaseModel):
    """How candidates are compiled."""

    nvcc: str | None = None
    """Path to nvcc; found on PATH or under $CUDA_HOME/bin when unset."""
    arch: str | None = None
    """Target such as `sm_90`; detected from the GPU (nvidia-smi) when unset, else sm_90."""
    flags: list[str] = Field(default_factory=lambda: ["-O3", "-lineinfo"])
    """Extra nvcc flags for every candidate (the cache key includes them)."""
    timeout_s: float = 60.0
    """A build that takes longer is stopped and recorded as failed."""
    max_parallel: int = Field(default_factory=lambda: os.cpu_count() or 2)
    """How many nvcc processes run at once."""


class EvalSettings(BaseModel):
    """How candidates are proven correct and timed."""

    timeout_s: float = 30.0
    """Watchdog: a request to the GPU worker that takes longer kills the worker (a hung kernel)."""
    fresh_seeds: int = 2
    """Fresh seeded input sets drawn per card on top of the card's own input sets."""
    min_reps: int = 20
    """Timed repetitions at least, per kernel."""
    max_reps: int = 400
    """Timed repetitions at most, per kernel."""
    target_rel_error: float = 0.002
    """Stop repeating once the standard error of the median is under this share of it."""
    timing_budget_s: float = 1.0
    """GPU seconds that timing one candidate (with its baseline) may take at most."""
    ceiling_margin: float = 1.10
    """A kernel faster than this multiple of the measured ceiling skipped work: flagged as a cheat."""
    flush_bytes: int = 256 * 1024 * 1024
    """Scratch written before each timed launch to evict the L2 (60 MB on an H200)."""


class Settings(BaseSettings):
    """Everything a user can set. Nested fields use `__` in environment variables."""

    model_config = SettingsConfigDict(env_prefix="KERNELFORGE_", env_nested_delimiter="__", extra="ignore")

    build: BuildSettings = Field(default_factory=BuildSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments beat the environment, which beats the TOML file."""
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=config_file()))


def load_settings() -> Settings:
    """Read the settings once for a command."""
    return Settings()
