"""The Textual TUI. Only this package imports Textual; the engine never does."""

from __future__ import annotations

import os


def apply_ssh_defaults() -> None:
    """Over SSH: no animation and a lower frame rate, unless the user set them (call before importing Textual)."""
    if os.environ.get("SSH_CONNECTION"):
        os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
        os.environ.setdefault("TEXTUAL_FPS", "20")
