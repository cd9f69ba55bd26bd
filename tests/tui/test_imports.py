"""The engine, GPU, cards and store never import Textual: every non-TUI module is imported in a fresh
interpreter and `textual` must not be among the loaded modules (import-linter checks the same statically)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

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


def test_no_module_outside_the_tui_imports_textual() -> None:
    """All of them imported in one fresh interpreter: if none loads Textual, none does alone either (one
    imported alone loads a subset of what all of them load), and one interpreter is 90 times cheaper."""
    code = (
        "import sys, importlib\n"
        f"for name in {MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'textual' in sys.modules:\n"
        "        print(name)\n"
        "        break\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "", f"{result.stdout.strip()} imports textual"


def test_the_tui_sources_do_not_need_textual() -> None:
    """source.py is plain Python, usable (and testable) without a screen."""
    code = "import sys, kernelforge_tui.tui.source; print('textual' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
