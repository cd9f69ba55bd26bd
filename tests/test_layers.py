"""The layer contracts in pyproject.toml hold, and a broken one fails (import-linter, as CI runs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT), str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_package_keeps_its_layers() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "kernelforge_tui", tmp_path / "kernelforge_tui", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "kernelforge_tui" / "vocabulary" / "upward.py").write_text("import kernelforge_tui.engine.search\n")
    (tmp_path / "kernelforge_tui" / "gpu" / "screen.py").write_text("import textual.app\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "kernelforge_tui.vocabulary.upward -> kernelforge_tui.engine.search" in result.stdout
    assert "kernelforge_tui.gpu.screen -> textual" in result.stdout
