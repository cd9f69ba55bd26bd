"""The engine, GPU, cards and store never import Textual: each non-TUI module is imported alone in a
fresh interpreter and `textual` must not be among the loaded modules."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import kernelforge_tui

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(kernelforge_tui.__path__, "kernelforge_tui.")
    if not m.name.startswith("kernelforge_tui.tui")
    and m.name != "kernelforge_tui.gpu.worker"
    and not m.name.endswith(".__main__")  # runs a command when imported; its `main` module is checked
)


def test_there_are_modules_to_check() -> None:
    assert {"kernelforge_tui.store", "kernelforge_tui.engine.search", "kernelforge_tui.cli.main"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_module_does_not_import_textual(module: str) -> None:
    code = f"import sys, importlib; importlib.import_module({module!r}); print('textual' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False", f"{module} imports textual"


def test_the_tui_sources_do_not_need_textual() -> None:
    """source.py is plain Python, usable (and testable) without a screen."""
    code = "import sys, kernelforge_tui.tui.source; print('textual' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
