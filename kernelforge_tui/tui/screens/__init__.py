"""Modal screens: help, hint input, kernel editor, export folder, the progress chart, a node's LLM conversation,
the run's models, where the run measures (its cluster)."""

from kernelforge_tui.tui.screens.chart import ChartScreen
from kernelforge_tui.tui.screens.cluster import ClusterScreen
from kernelforge_tui.tui.screens.conversation import ConversationScreen
from kernelforge_tui.tui.screens.editor import EditorScreen
from kernelforge_tui.tui.screens.export import ExportScreen
from kernelforge_tui.tui.screens.help import HelpScreen
from kernelforge_tui.tui.screens.hint import HintScreen
from kernelforge_tui.tui.screens.models import ModelsScreen

__all__ = [
    "ChartScreen",
    "ClusterScreen",
    "ConversationScreen",
    "EditorScreen",
    "ExportScreen",
    "HelpScreen",
    "HintScreen",
    "ModelsScreen",
]
