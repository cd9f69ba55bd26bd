"""Modal screens: help, hint input, kernel editor."""

from kernelforge_tui.tui.screens.editor import EditorScreen
from kernelforge_tui.tui.screens.help import HelpScreen
from kernelforge_tui.tui.screens.hint import HintScreen

__all__ = ["EditorScreen", "HelpScreen", "HintScreen"]
