"""Suite tasks: numerics (being written)."""

from __future__ import annotations

from kernelforge_tui.suite.task import Task

TASKS: tuple[Task, ...] = ()
