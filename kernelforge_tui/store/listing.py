"""Where runs live, naming new ones, finding one by id or path, and listing them with their best results."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import ValidationError

from kernelforge_tui.models.runs import RunListing, SkippedRun
from kernelforge_tui.store.errors import StoreError
from kernelforge_tui.store.files import DB_NAME
from kernelforge_tui.store.runs import RunStore


def runs_root() -> Path:
    """Where runs live by default: `<data dir>/runs/<run-id>`."""
    from kernelforge_tui.config import data_dir

    return data_dir() / "runs"


def new_run_dir(card_name: str, root: Path | None = None) -> Path:
    """A fresh run directory name: `<UTC time>-<card name>` (made unique with a counter)."""
    base = root or runs_root()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    candidate = base / f"{stamp}-{card_name}"
    counter = 2
    while candidate.exists():
        candidate = base / f"{stamp}-{card_name}-{counter}"
        counter += 1
    return candidate


def resolve_run(run: str, root: Path | None = None) -> Path:
    """A run given as a directory path or as a run id under the runs root."""
    path = Path(run).expanduser()
    if (path / DB_NAME).is_file():
        return path
    under = (root or runs_root()) / run
    if (under / DB_NAME).is_file():
        return under
    raise StoreError(f"no run {run!r} (neither a run directory nor an id under {root or runs_root()})")


def list_runs(root: Path | None = None) -> RunListing:
    """Every readable run under `root` (default: the runs root), newest first, and the ones that could not be read."""
    base = root or runs_root()
    listing = RunListing(runs=[], skipped=[])
    if not base.is_dir():
        return listing
    for db in base.glob(f"*/{DB_NAME}"):
        try:
            with RunStore.open(db.parent, readonly=True) as store:
                listing.runs.append(store.run_info())
        except (StoreError, ValidationError) as exc:
            reason = str(exc) if isinstance(exc, StoreError) else f"unreadable run row: {exc.errors()[0]['msg']}"
            listing.skipped.append(SkippedRun(run_dir=db.parent, reason=reason))
    listing.runs.sort(key=lambda info: info.started_at, reverse=True)
    return listing
