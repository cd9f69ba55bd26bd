"""One exception base for everything kernelforge raises on purpose, the exit code each kind means, and the install
command a message names when an optional extra is missing (one form for every command: `install_fix`).

Why one base: the command-line face turns any `KernelForgeError` into one line and an exit code chosen by
the error's type, never by matching its text; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar

import kernelforge_tui


class KernelForgeError(Exception):
    """An error with a message a person can act on (what is wrong, and the fix)."""

    exit_code: ClassVar[int] = 1


class BadInput(KernelForgeError):
    """A file, a setting or an argument that cannot be used as it is (exit code 2)."""

    exit_code = 2


class NoGpu(KernelForgeError):
    """No usable NVIDIA GPU, driver or pycuda here (exit code 3)."""

    exit_code = 3


class CheckFailed(KernelForgeError):
    """What was asked ran, and the answer is no: a candidate or its baseline failed (exit code 1)."""

    exit_code = 1


class BaselineFailed(CheckFailed):
    """The card's baseline kernel did not build or evaluate: nothing can be measured against it."""


class FieldError(BadInput):
    """Bad input at a named place (a file, an environment variable) and field, with the fix, as one line:
    `where: field: problem. Fix: fix.` The parts stay apart for views that show them apart (`doctor`)."""

    def __init__(self, where: object, field: str | None, problem: str, fix: str) -> None:
        self.where = where
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.what()}. Fix: {fix}.")

    def what(self) -> str:
        """Where, which field, and what is wrong (the message without its fix)."""
        return f"{self.where}" + (f": {self.field}" if self.field else "") + f": {self.problem}"


def not_utf8(exc: UnicodeDecodeError) -> str:
    """The problem of a text file that is not UTF-8, with the first bad byte and where it is."""
    return f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"


def checkout() -> Path | None:
    """The source checkout kernelforge runs from (an editable install), or None for an installed package."""
    root = Path(kernelforge_tui.__file__).resolve().parent.parent
    try:
        project = (root / "pyproject.toml").read_text()
    except OSError:
        return None
    return root if 'name = "kernelforge-tui"' in project else None


def _short(path: Path, root: Path | None) -> str:
    """A path relative to the checkout (`.venv/bin/python`, `.`) when the working directory is the checkout, as in the
    README's commands; else absolute (pip reads a bare relative `name[gpu]` as a package name)."""
    if root is None or Path.cwd().resolve() != root or not path.is_relative_to(root):
        return str(path)
    relative = path.relative_to(root)
    return "." if relative == Path() else str(relative)


def install_fix(extra: str) -> str:
    """The command that installs an extra into the Python running kernelforge: from the checkout (`pip install -e
    '.[gpu]'`) when it runs from one, else the package from the index."""
    root = checkout()
    pip = f"{_short(Path(sys.executable), root)} -m pip install"
    if root is not None:
        return f"{pip} -e '{_short(root, root)}[{extra}]'"
    return f"{pip} 'kernelforge-tui[{extra}]'"
