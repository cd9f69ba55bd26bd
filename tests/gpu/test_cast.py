"""GPU tests of the .cast runtime and gate: run on the H200 with `pytest -m gpu tests/gpu/test_cast.py` (deselected
in CI). Needs torch with CUDA, cuda-bindings (or pycuda), nvcc and compute-sanitizer.

- the real launch path: the example softmax kernel, loaded into torch's context, matches torch.softmax, runs on
  torch's current stream (a side stream included), allocates with torch, and the counters see hits and fallbacks;
- the hot path's launch through libcuda (cuLaunchKernelEx, and cuLaunchKernel for older drivers) on the default
  stream and a side one, and from four threads at once (each its own argument block);
- pycuda as the binding: default stream only, another stream falls back with the reason;
- the sanitizer gate: memcheck rejects the out-of-bounds cheat, racecheck a kernel with a shared-memory race, and
  an honest kernel passes all three tools;
- export of the recorded H200 softmax run with every check, and verify re-stamping a package for this machine;
- a verified package edited afterwards (a cubin swapped with its hash) refused at load;
- a captured softmax over the last axis of a 4-D tensor (the decoder block's, small) whose card sees [rows, cols]:
  the guard takes the call's shapes, the checks and the sanitizer's launch build the call in them.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build.nvcc import detect_arch
from kernelforge_tui.cards import plan_for_kernel
from kernelforge_tui.cast import load
from kernelforge_tui.cast.export import export
from kernelforge_tui.cast.manifest import SANITIZER_TOOLS, CastError, Stamp, read_package, sha256, write_package
from kernelforge_tui.cast.sanitizer import find_sanitizer, run_tool
from kernelforge_tui.cli.main import main
from tests.support.fixtures.cast.cast_support import EXAMPLES, make_run, members_of, rezip

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SMALL = EXAMPLES / "cards" / "softmax_bf16_small"
BLOCK_ROW = SMALL / "candidates" / "block_row_bf16.cu"
CHEATS = EXAMPLES / "kernels" / "cheats" / "softmax_bf16_small"
RACY = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "cast" / "racy_softmax.cu"
DECODER = EXAMPLES / "models" / "decoder_block.py"
TOL = {"rtol": 0.016, "atol": 1e-8}


def unverified(tmp_path: Path, kernel: Path, name: str) -> Path:
    """A package of `kernel` for the small bf16 softmax card, built for this GPU, not checked (the run is made up:
    these tests check the launch path and the gate themselves)."""
    run_dir = tmp_path / f"run-{name}"
    make_run(run_dir, SMALL, kernel.read_text(), plan_for_kernel(kernel), 10.0, 100.0)
    path = tmp_path / f"{name}.cast"
    export(run_dir, path, sanitize=False, arch=detect_arch())
    assert read_package(path).manifest.kernels, "the made-up run must export a kernel"
    return path


def stamped_here(path: Path) -> Path:
    """The package stamped for this machine without checks (test only: load() then accepts it)."""
    from kernelforge_tui.cast.runtime import probe_machine

    package = read_package(path)
    machine = probe_machine()
    assert machine is not None
    stamp = Stamp(machine=machine, at=time.time(), by="verify", sanitizer=False)
    files = package.members
    write_package(path, package.manifest.model_copy(update={"stamp": stamp}), files)
    return path


class Recording:
    """The real binding, recording the stream of every launch."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.name = real.name
        self.streams: list[int] = []

    def load(self, *args: Any) -> Any:
        return self.real.load(*args)

    def launch(self, function: Any, grid: Any, block: Any, shared: int, stream: int, pointers: Any) -> None:
        self.streams.append(stream)
        self.real.launch(function, grid, block, shared, stream, pointers)

    def driver_version(self) -> int:
        return int(self.real.driver_version())


def _close(out: Any, ref: Any) -> None:
    from kernelforge_tui.cast.manifest import Tolerance
    from kernelforge_tui.cast.runtime import disagreement

    assert disagreement(out, ref, Tolerance(**TOL)) == ""


def test_the_softmax_kernel_runs_on_torch_tensors_on_the_current_stream(tmp_path: Path) -> None:
    from kernelforge_tui.cast.driver import driver

    path = stamped_here(unverified(tmp_path, BLOCK_ROW, "block_row"))
    recording = Recording(driver())
    x = torch.randn(21, 1003, device="cuda", dtype=torch.bfloat16) * 2
    misaligned = torch.empty(21 * 1003 + 8, device="cuda", dtype=torch.bfloat16)[8:].view(21, 1003)
    misaligned.copy_(x)
    side = torch.cuda.Stream()
    with load(path, driver=recording) as cast:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = torch.softmax(x, -1)
        side.synchronize()
        on_default = torch.softmax(x, dim=-1)
        fallbacks = [torch.softmax(x.float(), -1), torch.softmax(misaligned, -1), torch.softmax(x[:20], -1)]
        on_cpu = torch.softmax(x.cpu(), -1)
        torch.cuda.synchronize()
    eager = torch.softmax(x, -1)
    _close(on_side, eager)
    _close(on_default, eager)
    assert recording.streams == [side.cuda_stream, torch.cuda.current_stream().cuda_stream]
    assert on_side.dtype == torch.bfloat16 and on_side.is_contiguous() and on_side.device == x.device
    _close(fallbacks[1], eager)
    assert torch.equal(on_cpu, torch.softmax(x.cpu(), -1))
    stats = cast.stats()
    (kernel,) = stats.kernels
    assert kernel.hits == 2
    assert kernel.fallbacks == {
        "dtype self float32 (kernel: bfloat16)": 1,
        "self not 256-byte aligned (a view that starts mid-buffer)": 1,
    }
    assert stats.overloads[0].uncovered == {"shape [20, 1003] bfloat16": 1}
    # Out of the block, the operator is torch's own again.
    before = len(recording.streams)
    torch.softmax(x, -1)
    assert len(recording.streams) == before


@pytest.mark.parametrize("extended", [True, False], ids=["cuLaunchKernelEx", "cuLaunchKernel"])
def test_both_driver_launch_functions_run_the_kernel(
    tmp_path: Path, extended: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Python hot path calls libcuda's launch through ctypes with prepared arguments: cuLaunchKernelEx and its
    # launch config where the driver has it (CUDA 12+), else cuLaunchKernel; both on the default stream and a side
    # one. (The compiled launcher, which would take these hits, is off: tests/gpu/test_cast_launcher.py tests it.)
    import ctypes

    from kernelforge_tui.cast import driver as drivers
    from kernelforge_tui.cast.launcher import ENV_LAUNCHER

    monkeypatch.setenv(ENV_LAUNCHER, "off")

    real = drivers.driver()
    if not isinstance(real, drivers.CudaBindings):
        pytest.skip("the ctypes launch is cuda-bindings' path")
    binding = drivers.CudaBindings(real.cu, "test")
    raw = drivers.libcuda_launch()
    assert raw is not None and raw.extended, "a CUDA 12+ driver exports cuLaunchKernelEx"
    if not extended:
        plain = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
        plain.restype = ctypes.c_int
        raw = drivers.RawLaunch(plain, extended=False)
    binding._raw = raw
    path = stamped_here(unverified(tmp_path, BLOCK_ROW, "block_row"))
    x = torch.randn(21, 1003, device="cuda", dtype=torch.bfloat16) * 2
    side = torch.cuda.Stream()
    with load(path, driver=binding) as cast:
        first, second = torch.softmax(x, -1), torch.softmax(x, -1)  # the full guard, then the hot path
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = torch.softmax(x, -1)
        side.synchronize()
    torch.cuda.synchronize()
    eager = torch.softmax(x, -1)
    for y in (first, second, on_side):
        _close(y, eager)
    assert cast.stats().kernels[0].hits == 3 and binding.retries == 0


@pytest.mark.parametrize("launcher", ["on", "off"])
def test_threads_launch_at_once_each_with_its_own_argument_block(
    tmp_path: Path, launcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver call lets the GIL go: two threads launching the same kernel must not see each other's pointers
    # (the Python path's argument blocks; the compiled launcher's table, read by four threads at once).
    import threading

    from kernelforge_tui.cast.launcher import ENV_LAUNCHER

    monkeypatch.setenv(ENV_LAUNCHER, launcher)

    path = stamped_here(unverified(tmp_path, BLOCK_ROW, "block_row"))
    inputs = [torch.randn(21, 1003, device="cuda", dtype=torch.bfloat16) * (i + 1) for i in range(4)]
    results: dict[int, list[Any]] = {}

    def work(i: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            results[i] = [torch.softmax(inputs[i], -1) for _ in range(50)]
        stream.synchronize()

    with load(path) as cast:
        torch.softmax(inputs[0], -1)  # the device admitted by the full guard
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    torch.cuda.synchronize()
    for i, outs in results.items():
        eager = torch.softmax(inputs[i], -1)
        for out in outs:
            _close(out, eager)
    assert cast.stats().kernels[0].hits == 1 + 4 * 50


def test_pycuda_launches_on_the_default_stream_only(tmp_path: Path) -> None:
    pytest.importorskip("pycuda")
    path = stamped_here(unverified(tmp_path, BLOCK_ROW, "block_row"))
    x = torch.randn(21, 1003, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    with load(path, binding="pycuda") as cast:
        y = torch.softmax(x, -1)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            z = torch.softmax(x, -1)
        side.synchronize()
    _close(y, torch.softmax(x, -1))
    _close(z, torch.softmax(x, -1))
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 1
    assert kernel.fallbacks == {"torch's current stream is not the default stream, and pycuda launches only there": 1}


@pytest.mark.skipif(find_sanitizer() is None, reason="compute-sanitizer not found")
def test_the_sanitizer_gate(tmp_path: Path) -> None:
    sanitizer = find_sanitizer()
    assert sanitizer is not None
    oob = unverified(tmp_path, CHEATS / "out_of_bounds.cu", "oob")
    racy = unverified(tmp_path, RACY, "racy")
    good = unverified(tmp_path, BLOCK_ROW, "good")
    kernel = {p: read_package(p).manifest.kernels[0].id for p in (oob, racy, good)}
    memcheck = run_tool(sanitizer, "memcheck", oob, kernel[oob])
    assert not memcheck.ok and "Invalid __global__ write" in memcheck.report, memcheck.report[-2000:]
    race = run_tool(sanitizer, "racecheck", racy, kernel[racy])
    assert not race.ok and "hazard" in race.report.lower(), race.report[-2000:]
    for tool in SANITIZER_TOOLS:
        verdict = run_tool(sanitizer, tool, good, kernel[good])
        assert verdict.ok, (tool, verdict.summary, verdict.report[:1500], verdict.report[-800:])


@pytest.mark.skipif(find_sanitizer() is None, reason="compute-sanitizer not found")
def test_verify_leaves_out_an_unsafe_kernel_with_its_report(tmp_path: Path) -> None:
    from kernelforge_tui.cast.verify import verify

    manifest = verify(unverified(tmp_path, CHEATS / "out_of_bounds.cu", "oob"))
    assert manifest.kernels == [] and manifest.stamp is not None
    (audit,) = manifest.audit
    assert audit.decision == "fallback" and "compute-sanitizer memcheck" in audit.reason, audit.reason


def test_export_of_the_recorded_h200_run_passes_every_check(tmp_path: Path) -> None:
    run_dir = tmp_path / "softmax_bf16"
    shutil.copytree(EXAMPLES / "runs" / "softmax_bf16", run_dir)
    path = tmp_path / "softmax.cast"
    manifest = export(run_dir, path)
    assert len(manifest.kernels) == 1, manifest.audit
    (kernel,) = manifest.kernels
    assert [(c.name, c.ok) for c in kernel.checks] == [
        ("correctness", True),
        ("memcheck", True),
        ("racecheck", True),
        ("initcheck", True),
        ("timing", True),
    ]
    assert kernel.latency.speedup_vs_eager is not None and kernel.latency.speedup_vs_eager > 1
    x = torch.randn(4096, 32768, device="cuda", dtype=torch.bfloat16) * 2
    with load(path) as cast:
        y = torch.softmax(x, -1)
    _close(y, torch.softmax(x, -1))
    assert cast.stats().hits == 1


def test_a_captured_4d_softmax_is_checked_through_its_card_view(tmp_path: Path) -> None:
    from kernelforge_tui.capture.manifest import load_capture
    from kernelforge_tui.cards import load_card

    capture = tmp_path / "decoder"
    argv = ["capture", str(DECODER), "--device", "cuda", "--kwarg", "size=small", "--repeats", "2", "-o", str(capture)]
    assert main(argv) == 0
    (variant,) = [v for v in load_capture(capture).variants if v.op == "aten._softmax.default" and v.card]
    assert variant.card is not None
    card_dir = capture / variant.card
    card = load_card(card_dir)
    assert card.spec.baseline is not None
    make_run(capture / "runs" / "softmax", card_dir, card.baseline_source(), card.spec.baseline.plan, 10.0, 100.0)
    manifest = export(capture, tmp_path / "decoder.cast")
    (audit,) = [a for a in manifest.audit if a.variant.startswith(variant.id)]
    if audit.decision == "fallback":  # the plain baseline on [2, 4, 16, 16] need not beat eager; nothing else fails
        assert audit.reason.startswith("left out: not faster than eager PyTorch beyond the noise"), audit.reason
        return
    (kernel,) = manifest.kernels
    assert kernel.guard.inputs[0].shape == (2, 4, 16, 16) and kernel.guard.inputs[0].card_shape == (128, 16)
    assert all(c.ok for c in kernel.checks) and len(kernel.checks) == 5, kernel.checks


def test_verify_restamps_a_package_for_this_machine(tmp_path: Path) -> None:
    path = stamped_here(unverified(tmp_path, BLOCK_ROW, "block_row"))
    package = read_package(path)
    stamp = package.manifest.stamp
    assert stamp is not None
    elsewhere = stamp.model_copy(update={"machine": stamp.machine.model_copy(update={"torch_version": "0.0.1"})})
    files = package.members
    write_package(path, package.manifest.model_copy(update={"stamp": elsewhere}), files)
    with pytest.raises(CastError, match=r"torch 0\.0\.1 there"):
        load(path)
    code = main(["verify", str(path)])
    assert code in (0, 1)  # 1: kept no kernel (eager may be as fast on 21 x 1003); the stamp is new either way
    with load(path) as cast:
        assert cast.package is not None and cast.package.manifest.stamp is not None
        assert cast.package.manifest.stamp.by == "verify" and cast.package.manifest.stamp.sanitizer


def test_a_verified_package_edited_afterwards_is_refused_at_load(tmp_path: Path) -> None:
    # The stamp verify writes is bound to the contents: a consistent cubin swap (its hash updated) is caught at
    # load(), before any call reaches the kernel.
    run_dir = tmp_path / "run"
    make_run(run_dir, SMALL, BLOCK_ROW.read_text(), plan_for_kernel(BLOCK_ROW), 10.0, 100.0)
    path = tmp_path / "m.cast"
    manifest = export(run_dir, path, sanitize=True)
    if not manifest.kernels:
        pytest.skip("eager was as fast on 21 x 1003 here: nothing was kept to edit")
    with load(path):
        pass
    members = members_of(path)
    entry = manifest.kernels[0]
    other = members[entry.files.cubin] + b"\0"
    text = json.loads(members["manifest.json"])
    text["kernels"][0]["files"]["sha256"][entry.files.cubin] = sha256(other)
    rezip(path, {**members, entry.files.cubin: other, "manifest.json": json.dumps(text).encode()})
    with pytest.raises(CastError, match="its stamp does not match its contents"):
        load(path)
