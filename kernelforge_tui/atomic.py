"""Atomic replacement of a file: written beside it under a temporary name, then renamed onto it (`os.replace`).

A reader, a crash or a kill sees the old file or the new one, never half of either: the rename is atomic because
the temporary name lies in the target's own directory, so on its filesystem. A failed write leaves the target as
it was and removes the temporary. The temporary's name is new each time (process id and a random token), so two
writers of one file, in one process or two, never share one; the last rename wins.

The data is not fsync'd: this guards against kills and readers that poll, not against a power cut (what is
written this way, caches and manifests, can be made again). The temporary is created with the permissions of a
plain `Path.write_bytes` (0o666 less the umask), so the target's permissions do not change with the helper.

Standard library only, and nothing of the package: every layer may import it, the `.cast` runtime's manifest too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path


def temporary_beside(path: Path, tag: str = "tmp") -> Path:
    """A fresh hidden name in `path`'s directory (not created): `.NAME.PID.TOKEN.TAG`."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.{tag}")


@contextlib.contextmanager
def replacing(path: Path, *, tag: str = "tmp", companions: Sequence[str] = ()) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write (a file, a SQLite database, a package) and close.

    When the block ends without an error, the temporary is renamed onto `path`; a block that leaves no file at the
    temporary path (it removed it, or never wrote one) leaves `path` as it was. On an error (in the block or in the
    rename) the temporary is removed and the error goes on. `companions` are suffixes of files made beside the
    temporary (SQLite's `-wal`, `-shm`), removed with it.
    """
    tmp = temporary_beside(path, tag)
    try:
        yield tmp
        if tmp.exists():
            os.replace(tmp, path)
    finally:
        for leftover in (tmp, *(tmp.with_name(tmp.name + suffix) for suffix in companions)):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` at once (bytes as they are, text as `Path.write_text` writes it)."""
    with replacing(path) as tmp:
        if isinstance(data, bytes):
            with tmp.open("xb") as f:
                f.write(data)
        else:
            with tmp.open("x") as f:
                f.write(data)
