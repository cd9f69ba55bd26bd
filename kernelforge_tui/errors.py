"""One exception base for everything kernelforge raises on purpose, and the exit code each kind means.

Why one base: the command-line face turns any `KernelForgeError` into one line and an exit code chosen by
the error's type, never by matching its text; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import ClassVar


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
