"""Where runs live, naming new ones, finding one by id or path, listing them with their best results, and copying
one (an example, to steer or continue it)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from pydantic import ValidationError

from kernelforge_tui.atomic import replacing
from kernelforge_tui.store.card_path import recorded_card_dir
from kernelforge_tui.store.errors import StoreError
from kernelforge_tui.store.files import DB_NAME, connect, named
from kernelforge_tui.store.runs import RunStore
from kernelforge_tui.vocabulary.runs import RunListing, SkippedRun


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


def copy_run(src: Path, dest: Path) -> Path:
    """Copy the run in `src` to the new directory `dest`, consistently (SQLite's online backup: a live writer's run
    is copied as of one commit), without its writer lock or example mark; the copy is named after `dest` and records
    the same card, relative to `dest`. The copy appears whole or not at all (built under a temporary name)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise StoreError(f"{dest} already exists: give a new directory for the copy")
    with RunStore.open(src, readonly=True) as source:
        card_dir = source.card_dir()
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {dest} ({exc.strerror}): pick another directory") from None
        with (
            replacing(dest / DB_NAME, companions=("-wal", "-shm")) as tmp,
            named(tmp),
            contextlib.closing(connect(tmp, readonly=False)) as copy,
        ):
            source.backup(copy)
            copy.execute("UPDATE run SET id = ?, card_dir = ?", (dest.name, recorded_card_dir(card_dir, dest)))
    return dest
