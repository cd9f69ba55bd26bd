"""Export and use .cast packages: the search's proven kernels, guarded, inside an unmodified PyTorch model.

`with kernelforge_tui.cast.load("model.cast"):` runs the model with the package's kernels (`cast.runtime`);
`kernelforge_tui.cast.compile(model, "model.cast", mode=...)` (or `torch.compile(model, backend="kernelforge")`)
compiles it with Inductor and the package's kernels in its graphs (`cast.compiled`); `kernelforge_tui.cast.graph(
model, example_inputs, "model.cast")` captures its eager forward with them into a CUDA graph (`cast.cuda_graph`);
`kernelforge export`, `verify` and `run` make, re-check and use packages (`cast.export`, `cast.verify`). Importing
this package imports neither torch nor a CUDA binding: each function brings in what it needs when it is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelforge_tui.cast.manifest import CastError, CastManifest, read_package

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from kernelforge_tui.cast.cuda_graph import GraphedForward
    from kernelforge_tui.cast.runtime import Cast

__all__ = ["CastError", "CastManifest", "compile", "graph", "load", "read_package"]


def load(path: Path | str, **options: Any) -> Cast:
    """Open a package for a `with` block (see `kernelforge_tui.cast.runtime.load` for the options)."""
    from kernelforge_tui.cast.runtime import load as load_package

    return load_package(path, **options)


def compile(model: Callable[..., Any], package: Cast | Path | str, **options: Any) -> Any:
    """`torch.compile` with the package's kernels in its graphs (see `kernelforge_tui.cast.compiled.compile`)."""
    from kernelforge_tui.cast.compiled import compile as compile_with

    return compile_with(model, package, **options)


def graph(
    model: Callable[..., Any], example_inputs: Sequence[Any], package: Cast | Path | str | None = None
) -> GraphedForward:
    """The eager forward with the package, in a CUDA graph (see `kernelforge_tui.cast.cuda_graph.graph`)."""
    from kernelforge_tui.cast.cuda_graph import graph as capture

    return capture(model, example_inputs, package)
