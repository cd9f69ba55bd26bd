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
