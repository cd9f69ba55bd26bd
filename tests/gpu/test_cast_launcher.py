"""GPU tests of the compiled launcher (cast/cpp/launcher.cpp): run on the H200 with
`pytest -m gpu tests/gpu/test_cast_launcher.py` (deselected in CI). Needs torch with CUDA, cuda-bindings, nvcc, a
C++ compiler and ninja. The package is the small bf16 softmax card's block-row kernel, built for this GPU (as in
tests/gpu/test_cast.py).

- hits after the first (which the Python guard decides) launch from C++ (the Python launch is made to fail, and
  nothing fails), on torch's current stream (a side stream included), with outputs equal to the Python path's;
- refused signatures (another dtype, another shape) and a misaligned pointer run eager's kernel, counted as before;
- inside a CUDA graph capture (torch.cuda.graph's own stream) the launch is captured and replays with new inputs.

The host time per call (eager, through the launcher, through the Python path) is the bench's:
`python bench/cast_gpu.py --host-only ...` (`host_overhead`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.cast import load
from kernelforge_tui.cast.launcher import ENV_LAUNCHER
from tests.gpu.test_cast import BLOCK_ROW, _close, stamped_here, unverified

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SHAPE = (21, 1003)


def _package(tmp_path: Path) -> Path:
    return stamped_here(unverified(tmp_path, BLOCK_ROW, "block_row"))


def _python_launch_fails(cast: Any) -> None:
    """After the first hit: the Python path's prepared launch raises, so any later hit it made would fail."""

    def fail(stream: int, pointers: list[int]) -> None:
        raise AssertionError("a hit took the Python path")

    (runner,) = cast.runners
    runner.launchers[torch.cuda.current_device()] = fail


def test_hits_launch_from_cpp_on_the_current_stream_as_the_python_path_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _package(tmp_path)
    x = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16) * 2
    side = torch.cuda.Stream()
    with load(path) as cast:
        assert cast.stats().launcher == "compiled", cast.stats().launcher
        first = torch.softmax(x, -1)  # the Python guard decides and launches
        _python_launch_fails(cast)
        ours = [torch.softmax(x, -1) for _ in range(5)]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x_side = x * 3
            on_side = torch.softmax(x_side, -1)
        torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    monkeypatch.setenv(ENV_LAUNCHER, "off")
    with load(path) as python:
        assert python.stats().launcher == f"Python path: turned off by {ENV_LAUNCHER}=off"
        theirs = torch.softmax(x, -1)
        theirs_side = torch.softmax(x * 3, -1)
    torch.cuda.synchronize()
    assert all(torch.equal(y, theirs) for y in [first, *ours]) and torch.equal(on_side, theirs_side)
    _close(on_side, torch.softmax(x_side, -1))
    assert on_side.dtype == torch.bfloat16 and on_side.is_contiguous() and on_side.device == x.device
    assert cast.stats().kernels[0].hits == 7 and python.stats().kernels[0].hits == 2


def test_refused_signatures_and_a_misaligned_pointer_run_eager(tmp_path: Path) -> None:
    path = _package(tmp_path)
    x = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16) * 2
    misaligned = torch.empty(SHAPE[0] * SHAPE[1] + 8, device="cuda", dtype=torch.bfloat16)[8:].view(*SHAPE)
    misaligned.copy_(x)
    with load(path) as cast:
        torch.softmax(x, -1)
        _python_launch_fails(cast)
        calls = [x.float(), x[:20], misaligned]
        outs = [[torch.softmax(t, -1) for _ in range(3)] for t in calls]  # refusals replayed from C++
        hit = torch.softmax(x, -1)
    torch.cuda.synchronize()
    for t, got in zip(calls, outs, strict=True):
        for y in got:
            assert torch.equal(y, torch.softmax(t, -1))
    _close(hit, torch.softmax(x, -1))
    stats = cast.stats()
    (kernel,) = stats.kernels
    assert kernel.hits == 2
    assert kernel.fallbacks == {
        "dtype self float32 (kernel: bfloat16)": 3,
        "self not 256-byte aligned (a view that starts mid-buffer)": 3,
    }
    assert stats.overloads[0].uncovered == {"shape [20, 1003] bfloat16": 3}


def test_a_cuda_graph_captures_the_compiled_launch(tmp_path: Path) -> None:
    path = _package(tmp_path)
    x = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16)
    eager = torch.softmax(x, -1)
    with load(path) as cast:
        _close(torch.softmax(x, -1), eager)  # decided (and warm) outside the capture
        _python_launch_fails(cast)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # on a capture stream of its own: the launch must go there
            y = torch.softmax(x, -1)
    for scale in (1.0, 4.0):
        fresh = torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16) * scale
        x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        _close(y, torch.softmax(fresh, -1))
    assert cast.stats().kernels[0].hits == 2  # the warm call and the captured one; a replay calls nothing
