"""Where a run's card is: recorded relative to the run's directory, read back as a path that exists here.

Why relative: a run and its card often move together (a checkout's examples/runs and examples/cards, a capture
directory with its runs inside), and an absolute path names the machine the run was made on. Runs recorded with an
absolute path still open: the path is used where it exists, else the card is looked for by the path's tail under
the run's parent directories (the same examples/cards/NAME in another checkout).
"""

from __future__ import annotations

import os
from pathlib import Path

from kernelforge_tui.cards.directory import MANIFEST


def recorded_card_dir(card_root: Path, run_dir: Path) -> str:
    """What a run records for its card: the card's directory relative to the run's (absolute across drives)."""
    card = card_root.resolve()
    try:
        return os.path.relpath(card, run_dir.resolve())
    except ValueError:  # another drive (Windows): no relative path exists
        return str(card)


def resolve_card_dir(run_dir: Path, recorded: str) -> Path:
    """The card directory a run recorded, as a path here: relative to the run's directory, or absolute where it
    exists, else the same tail under one of the run's parent directories; the recorded path when none is found
    (loading the card then fails naming it)."""
    stored = Path(recorded)
    path = stored if stored.is_absolute() else Path(os.path.normpath(run_dir.absolute() / stored))
    if (path / MANIFEST).is_file():
        return path
    tail = [part for part in stored.parts if part not in (stored.anchor, "..", ".")]
    here = run_dir.absolute()
    for base in (here, *here.parents):
        for start in range(len(tail)):
            found = base.joinpath(*tail[start:])
            if (found / MANIFEST).is_file():
                return found
    return path
