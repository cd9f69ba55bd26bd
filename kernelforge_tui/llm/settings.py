"""One provider's settings: where it is, which wire protocol it speaks, and how patient to be with it.

Why only the variable's name: the API key is read from the environment at call time and never stored, so it cannot
reach the store, a log, an export or a repr.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator

from kernelforge_tui.config import Section


class Timeouts(Section):
    connect_s: float = Field(default=10.0, gt=0)
    idle_s: float = Field(default=60.0, gt=0)
    """Longest wait for the response headers or the next line of the stream: a stalled provider is caught here."""
    total_s: float = Field(default=600.0, gt=0)
    """Whole call, retries and their waits included: once it is spent nothing is retried."""


class Retries(Section):
    max_attempts: int = Field(default=4, ge=1)
    backoff_s: float = Field(default=1.0, ge=0)
    """Attempt n waits about backoff_s * 2**(n-1), jittered, unless the server says how long (Retry-After)."""
    backoff_max_s: float = Field(default=30.0, ge=0)


class ProviderSettings(Section):
    name: str = Field(min_length=1)
    protocol: Literal["openai", "anthropic"]
    base_url: str = Field(min_length=1)
    """OpenAI-compatible: up to and including the version, e.g. https://api.openai.com/v1 or http://localhost:8000/v1;
    Anthropic: without it, e.g. https://api.anthropic.com."""
    api_key_env: str | None = None
    """The NAME of the environment variable that holds the key; None for a local server that needs none."""
    max_concurrency: int = Field(default=4, ge=1)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    retries: Retries = Field(default_factory=Retries)

    @field_validator("base_url")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")

    def api_key(self) -> str | None:
        """The key, read now from the environment (None when unset or empty)."""
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env) or None
