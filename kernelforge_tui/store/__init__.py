"""The run store: one SQLite database per run directory, holding everything the search knows.

Why SQLite in WAL mode: the search commits every node as it happens, so a `kill -9` loses at most the
candidates in flight; a second process (the TUI following a live run) reads while the search writes;
and a TUI in another process steers the run by writing commands the search polls. The schema carries a
version and a list of migrations, so old runs stay readable.

The modules, one job each (they import one another, never this package's names):
- `schema`: the migrations and the version a file records;
- `lock`: the run's writer lock (one writer, its search) and the liveness probe viewers use;
- `files`: the database file: connecting (read-only with the immutable fallback), SQLite's errors as one line, and
  which runs are never written (shipped examples, stores this user cannot write);
- `card_path`: the run's card directory, recorded relative to the run and found again on opening;
- `database`: one open database: the thread lock, write transactions, reads, migrating, the integrity check;
- `records`: stored rows read back as models;
- `nodes`, `messages`: the node and profile queries, the event and command queries;
- `runs`: RunStore, opening a run (create, open, resume) and its run row;
- `listing`: where runs live, naming, finding, listing and copying them;
- `errors`: StoreError and its kinds.
"""

from kernelforge_tui.store.errors import StoreError, UnknownNode, UnreadableRecord
from kernelforge_tui.store.files import DB_NAME, EXAMPLE_MARK, read_only_reason
from kernelforge_tui.store.listing import copy_run, list_runs, new_run_dir, resolve_run, runs_root
from kernelforge_tui.store.runs import RunStore
from kernelforge_tui.store.schema import SCHEMA_VERSION

__all__ = [
    "DB_NAME",
    "EXAMPLE_MARK",
    "SCHEMA_VERSION",
    "RunStore",
    "StoreError",
    "UnknownNode",
    "UnreadableRecord",
    "copy_run",
    "list_runs",
    "new_run_dir",
    "read_only_reason",
    "resolve_run",
    "runs_root",
]
