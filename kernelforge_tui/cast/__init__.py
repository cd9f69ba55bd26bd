"""Export and use .cast packages: the search's proven kernels, guarded, inside an unmodified PyTorch model.

`with kernelforge_tui.cast.load("model.cast"):` runs the model with the package's kernels (`cast.runtime`);
`kernelforge export`, `verify` and `run` make, re-check and use packages (`cast.export`, `cast.verify`). Importing
this package imports neither torch nor a CUDA binding: `load` brings in the runtime when it is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelforge_tui.cast.manifest import CastError, CastManifest, read_package

if TYPE_CHECKING:
    from kernelforge_tui.cast.runtime import Cast

__all__ = ["CastError", "CastManifest", "load", "read_package"]


def load(path: Path | str, **options: Any) -> Cast:
    """Open a package for a `with` block (see `kernelforge_tui.cast.runtime.load` for the options)."""
    from kernelforge_tui.cast.runtime import load as load_package

    return load_package(path, **options)
