"""The project's scripts (bench/*.py, examples/cards/make_cards.py: files, not package modules), imported by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: Path) -> ModuleType:
    """The script at `path` as a module named by its stem, registered in sys.modules: pydantic resolves a module's
    annotations through it. bench/ goes on sys.path first, where the bench scripts import their siblings."""
    bench = str(ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
