"""The CUTLASS/CuTe headers candidates may include: where they are, which version, and a hash of the whole tree.

Why from a pinned package: a GEMM candidate is hundreds of lines of CUTLASS templates over a few lines of its own,
so what it computes depends on the headers as much as on its source. They come from the `nvidia-cutlass` wheel (the
`cutlass` extra pins it), which ships the C++ include tree under `cutlass_library/source/include` (cute/ and
cutlass/). The sandboxed build adds exactly that directory, read-only, as an include root; the source check lets a
candidate include `<cute/...>` and `<cutlass/...>` from it and nothing else new; the version and a hash of every file
under it enter the build cache key of every source that includes them, so an edited or upgraded tree builds again.

The package is found with `importlib.util.find_spec`, which locates it without importing it (its Python side needs
cuda-python, scipy and networkx, none of which a build uses).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kernelforge_tui.errors import install_fix

PACKAGE = "cutlass_library"
DISTRIBUTION = "nvidia-cutlass"
PINNED = "4.2.0.0"
"""The version the `cutlass` extra installs and the templates are written (and were measured) against."""
INCLUDE_SUBDIR = ("source", "include")
ROOTS = ("cute", "cutlass")
"""The include tree's top directories: a candidate's `#include <cute/...>` and `<cutlass/...>`."""
ALLOWED_PATTERNS: frozenset[str] = frozenset(f"{root}/*" for root in ROOTS)
"""The source check's patterns for those headers (added to the allowed includes when the headers are here)."""
_DEFINE = re.compile(r"#define CUTLASS_(MAJOR|MINOR|PATCH) (\d+)")


class CutlassHeaders(BaseModel):
    """A usable include tree: its root (the directory holding cute/ and cutlass/), version and content hash."""

    model_config = ConfigDict(frozen=True)

    root: Path
    version: str
    """CUTLASS_MAJOR.MINOR.PATCH from cutlass/version.h, such as "4.2.0"."""
    distribution: str
    """The installed wheel's version ("4.2.0.0"), or "" for a tree given by path."""
    tree_hash: str
    """sha256 over every file's relative path and bytes under cute/ and cutlass/."""

    @property
    def pinned(self) -> bool:
        return self.distribution == PINNED


def header_version(root: Path) -> str | None:
    """MAJOR.MINOR.PATCH of the tree at `root`, or None when cutlass/version.h is missing or unreadable."""
    try:
        text = (root / "cutlass" / "version.h").read_text(encoding="utf-8")
    except OSError:
        return None
    parts = dict(_DEFINE.findall(text))
    if set(parts) != {"MAJOR", "MINOR", "PATCH"}:
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"


def tree_hash(root: Path) -> str:
    """sha256 over (relative path, size, bytes) of every file under cute/ and cutlass/, in sorted order (~0.1 s for
    the 27 MB of 4.2's tree)."""
    digest = hashlib.sha256()
    for top in ROOTS:
        for path in sorted(p for p in (root / top).rglob("*") if p.is_file()):
            data = path.read_bytes()
            digest.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
            digest.update(data)
    return digest.hexdigest()


def package_root() -> Path | None:
    """The include root inside the installed `nvidia-cutlass` wheel, or None when it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)), *INCLUDE_SUBDIR)


@cache
def headers_at(root: Path, distribution: str = "") -> CutlassHeaders | None:
    """The tree at `root` when it holds cute/ and cutlass/ with a readable version (hashed once per process)."""
    version = header_version(root)
    if version is None or not all((root / top).is_dir() for top in ROOTS):
        return None
    return CutlassHeaders(root=root, version=version, distribution=distribution, tree_hash=tree_hash(root))


def installed_distribution() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return ""


def find_cutlass() -> CutlassHeaders | None:
    """The installed wheel's headers, or None (then `cutlass_problem` says why)."""
    root = package_root()
    return headers_at(root, installed_distribution()) if root is not None else None


def cutlass_problem() -> str | None:
    """Why CUTLASS candidates cannot be built here (with the fix), or None when the headers are installed."""
    root = package_root()
    fix = f"{install_fix('cutlass')} (the {DISTRIBUTION}=={PINNED} wheel ships the headers)"
    if root is None:
        return f"the CUTLASS/CuTe headers are not installed: {fix}"
    if headers_at(root, installed_distribution()) is None:
        return f"{DISTRIBUTION} is installed but {root} holds no cute/ and cutlass/ include tree: {fix}"
    return None


def uses_cutlass(includes: list[str]) -> bool:
    """Whether any of a source's included header names is a CUTLASS/CuTe header."""
    return any(name.split("/", 1)[0] in ROOTS and "/" in name for name in includes)
