"""The README's development command and `.ci/run` install the same things and run the same tests: one set-up."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_test_command() -> list[list[str]]:
    """The README's one-line test set-up, split into its `&&` steps."""
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "pytest" in line and "pip" in line)
    return [shlex.split(step) for step in line.split("&&")]


def ci_steps() -> list[list[str]]:
    """`.ci/run`'s commands, comments and shell settings left out."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not re.match(r"\s*(#|set |cd |export )", line)]


def test_ci_installs_what_the_readme_installs() -> None:
    readme_pip = [step[step.index("install") + 1 :] for step in readme_test_command() if "install" in step]
    ci_pip = [step[step.index("install") + 1 :] for step in ci_steps() if "install" in step and "--upgrade" not in step]
    quiet_and_quick = {"-q", "--no-compile"}  # how pip installs, not what
    assert [[arg for arg in args if arg not in quiet_and_quick] for args in ci_pip] == readme_pip


def test_ci_runs_the_readme_test_command() -> None:
    readme_pytest = next(step for step in readme_test_command() if "pytest" in step)
    assert readme_pytest in ci_steps(), "the README's pytest line is not the one .ci/run runs"
