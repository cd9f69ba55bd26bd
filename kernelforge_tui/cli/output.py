"""How every command reports a failure: one line (or a JSON object with --json) and the exit code of its type."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape

from kernelforge_tui.errors import BadInput, KernelForgeError, NoGpu
from kernelforge_tui.gpu.profile import ProfileError

EXIT_OK, EXIT_FAILED = 0, 1


def fail(console: Console, as_json: bool, kind: str, message: str, code: int) -> int:
    if as_json:
        print(json.dumps({"ok": False, "error": kind, "message": message}))
    else:
        console.print(f"[red bold]error:[/] {escape(message)}")
    return code


def error_kind(exc: KernelForgeError) -> str:
    """The `error` field of a --json failure: what kind of problem, for scripts to branch on."""
    if isinstance(exc, ProfileError):
        return f"profile-{exc.kind}"
    if isinstance(exc, NoGpu):
        return "no-gpu"
    if isinstance(exc, BadInput):
        return "bad-input"
    return "failed"
