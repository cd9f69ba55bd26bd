"""`kernelforge_tui.cast.graph(model, example_inputs, package)`: the eager forward with the package's kernels,
captured once into a CUDA graph and replayed, for a model that is not compiled.

Why: every overridden call pays its trip through Python on the host (the dispatcher, the guard's lookup, the
allocation, the driver call), and a host-bound model loses that on every kernel. A replay costs one launch of the
whole graph, whatever the forward holds. What makes the capture sound: the package's launches go to torch's current
stream (the capture's) through one driver call with no host sync, and their outputs come from torch's allocator
(the graph's pool); warm-up forwards before the capture decide each call's guard and load each kernel, so the
captured forward does neither.

A graph replays exactly what it captured: the same shapes, dtypes and devices, the same kernels (a fallback
captured is a fallback replayed), reading the inputs from its own buffers (a call copies the new inputs in) and
writing the same output tensors each time (a replay overwrites the last one's results: clone what must be kept).
Inference only: captured under torch.no_grad().
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kernelforge_tui.cast.manifest import CastError
from kernelforge_tui.cast.runtime import ACTIVE_CASTS, Cast, load

WARMUP = 3
"""Forwards run before the capture, on a side stream (as torch.cuda.graphs asks)."""


class GraphedForward:
    """A captured forward: call it with inputs like the example inputs; it copies them in and replays."""

    def __init__(self, graph: Any, inputs: list[Any], outputs: Any, cast: Cast) -> None:
        self.graph = graph
        self.inputs = inputs
        """The graph's own input buffers (the example inputs' clones)."""
        self.outputs = outputs
        self.cast = cast
        self.layouts = [(tuple(t.shape), t.dtype, t.device) if _is_tensor(t) else None for t in inputs]

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != len(self.inputs):
            raise CastError(f"the graph was captured with {len(self.inputs)} inputs, not {len(inputs)}")
        for i, (buffer, given, layout) in enumerate(zip(self.inputs, inputs, self.layouts, strict=True)):
            if layout is None:
                if given != buffer:
                    raise CastError(f"input {i}: the graph was captured with {buffer!r}, not {given!r}")
                continue
            if (tuple(given.shape), given.dtype, given.device) != layout:
                shape, dtype, device = layout
                raise CastError(
                    f"input {i}: {list(given.shape)} {given.dtype} on {given.device}, where the graph was captured "
                    f"with {list(shape)} {dtype} on {device}: capture another graph for it"
                )
            buffer.copy_(given)
        self.graph.replay()
        return self.outputs


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def graph(
    model: Callable[..., Any], example_inputs: Sequence[Any], package: Cast | Path | str | None = None
) -> GraphedForward:
    """Capture `model(*example_inputs)` with the package's kernels into a CUDA graph (module docstring). `package`:
    a loaded Cast, a path, or None for the innermost one in force. CastError without a CUDA device, without a
    package, or for a package this machine refuses."""
    import torch

    if not torch.cuda.is_available():
        raise CastError("cast.graph captures a CUDA graph: it needs a CUDA device, and this torch sees none")
    if isinstance(package, Cast):
        cast = package
    elif package is not None:
        cast = load(package)
    elif ACTIVE_CASTS:
        cast = ACTIVE_CASTS[-1]
    else:
        raise CastError(
            "cast.graph needs a package: pass it (a path or a loaded Cast), or call it inside `with load()`"
        )
    inputs = [x.clone() if _is_tensor(x) else x for x in example_inputs]
    if any(_is_tensor(x) and not x.is_cuda for x in inputs):
        raise CastError("cast.graph captures CUDA work: move the model and its inputs to the GPU first")
    held = not cast.active
    if held:
        cast.activate()
    try:
        with torch.no_grad():
            make_stream: Callable[..., Any] = torch.cuda.Stream
            side = make_stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    model(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                outputs = model(*inputs)
    finally:
        if held:
            cast.deactivate()
    return GraphedForward(captured, inputs, outputs, cast)
