"""GPU tests of the kernelforge ops, the compile path and cast.graph: run on the H200 with
`pytest -m gpu tests/gpu/test_cast_compile.py` (deselected in CI). Needs torch with CUDA, Triton, cuda-bindings and
nvcc. The package is the small bf16 softmax card's block-row kernel, built for this GPU (as in tests/gpu/test_cast.py).

- the op launches on torch's current stream and is captured by a CUDA graph (torch.cuda.graph), replaying with new
  inputs copied in;
- cast.graph: the eager forward with the package, captured and replayed, matches eager on new inputs;
- cast.compile with Inductor, default and reduce-overhead (CUDA graph trees): outputs match eager, the softmax node
  is the kernel's op and the op ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.cast import compile as cast_compile
from kernelforge_tui.cast import graph as cast_graph
from kernelforge_tui.cast import load
from kernelforge_tui.cast.manifest import Latency, read_package, write_package
from kernelforge_tui.cast.ops import kernel_op
from tests.gpu.test_cast import BLOCK_ROW, _close, stamped_here, unverified

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SHAPE = (21, 1003)


def _package(tmp_path: Path) -> Path:
    """The package, its kernel timed as saving 10 us a call (made up, as its run is): the compile pass weighs that
    against the fusions with the block's scale and add it splits (`cast.fusion_cost`: well under 1 us here)."""
    path = unverified(tmp_path, BLOCK_ROW, "block_row")
    package = read_package(path)
    timed = [k.model_copy(update={"latency": Latency(kernel_us=5.0, eager_us=15.0)}) for k in package.manifest.kernels]
    write_package(path, package.manifest.model_copy(update={"kernels": timed}), package.members)
    return stamped_here(path)


def _block(x: Any) -> Any:
    return torch.softmax(x * 2, -1) + 1


def test_the_op_is_captured_by_a_cuda_graph(tmp_path: Path) -> None:
    cast = load(_package(tmp_path))
    op = kernel_op(cast.runners[0]).overload
    x = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16)
    _close(op(x), torch.softmax(x, -1))  # decided, loaded
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):  # on a capture stream of its own: the op launches on it
        y = op(x)
    fresh = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16) * 3
    x.copy_(fresh)
    captured.replay()
    torch.cuda.synchronize()
    _close(y, torch.softmax(fresh, -1))
    assert cast.stats().kernels[0].compiled_calls == 2  # the warm call and the captured one; a replay calls nothing


def test_cast_graph_replays_the_eager_forward_with_the_package(tmp_path: Path) -> None:
    cast = load(_package(tmp_path))
    x = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16)
    graphed = cast_graph(_block, [x], cast)
    hits = cast.stats().kernels[0].hits
    assert hits >= 2 and not cast.active  # warm-up and capture went through the kernel; the block is left
    for scale in (1.0, 4.0):
        fresh = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16) * scale
        out = graphed(fresh)
        torch.cuda.synchronize()
        _close(out, _block(fresh))
    assert cast.stats().kernels[0].hits == hits  # replays do not call Python


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_with_the_package_runs_the_kernel_inside_inductors_graph(tmp_path: Path, mode: str | None) -> None:
    torch._dynamo.reset()
    cast = load(_package(tmp_path))
    x = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        model = cast_compile(_block, cast, mode=mode)
        for scale in (1.0, 2.0, 3.0):
            fresh = x * scale
            out = model(fresh).clone()
            torch.cuda.synchronize()
            _close(out, _block(fresh))
    (kernel,) = cast.stats().kernels
    assert kernel.graph_nodes == 1 and kernel.compiled_calls >= 1 and kernel.used_in == "compile", cast.report()
