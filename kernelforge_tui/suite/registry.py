"""Every suite task by name, from the task modules (one per group of related operators)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from kernelforge_tui.suite.task import Task
from kernelforge_tui.suite.tasks import activations, dense, numerics, rows_and_heads, sparse

MODULES = (dense, sparse, activations, rows_and_heads, numerics)


def _collect() -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    for module in MODULES:
        for task in module.TASKS:
            if task.name in tasks:
                raise ValueError(f"two suite tasks named {task.name}")
            tasks[task.name] = task
    return tasks


TASKS = _collect()


def task(name: str) -> Task:
    """The task called `name`; a KeyError lists the names when there is none."""
    if name not in TASKS:
        raise KeyError(f"no suite task {name!r}: the suite has {', '.join(sorted(TASKS))}")
    return TASKS[name]


def select(patterns: Iterable[str]) -> list[Task]:
    """The tasks matching any of the glob patterns (all with none), in suite order; a pattern matching nothing is
    an error that lists the names."""
    wanted = list(patterns)
    if not wanted:
        return list(TASKS.values())
    for pattern in wanted:
        if not fnmatch.filter(TASKS, pattern):
            raise KeyError(f"--tasks {pattern!r} matches no task: the suite has {', '.join(TASKS)}")
    return [t for name, t in TASKS.items() if any(fnmatch.fnmatchcase(name, p) for p in wanted)]
