"""The compiled launcher (cast/cpp/launcher.cpp) on a CPU-only torch: built with torch's cpp_extension (once per
test session, in its cache directory), registered for the CPU dispatch key in front of the runtime's Python kernel,
with its launches routed through a ctypes stand-in of cuLaunchKernel that runs the host softmax. It replays the
Python guard's decisions (a hit launches from C++, a refused signature runs the original kernel), hands everything
else to the Python path, and its counts reach the runtime's counters. The real launch is tested on the GPU
(tests/gpu/test_cast_launcher.py)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernelforge_tui.cast import launcher as launchers  # noqa: E402
from kernelforge_tui.cast import load  # noqa: E402
from kernelforge_tui.cast.manifest import LaunchArg  # noqa: E402
from kernelforge_tui.cast.runtime import Cast  # noqa: E402
from tests.support.fixtures.cast.cast_support import MACHINE, HostSoftmax, softmax_entry, write_cast  # noqa: E402

HERE = MACHINE.model_copy(update={"torch_version": str(torch.__version__)})
HANDLE = 0x7F00_0000_5000

LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    *[ctypes.c_uint] * 7,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
)

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no compiler")


class HandleHostSoftmax(HostSoftmax):
    """The host softmax as a binding that gives function handles (as cuda-bindings does), so the compiled launcher
    takes its hits; the launches it makes come through `compiled`, the Python path's through `launch`."""

    def __init__(self, result: int = 0) -> None:
        """`result`: what every compiled launch returns (nonzero: the launch fails, as a CUresult)."""
        super().__init__()
        self.result = result
        self.compiled: list[tuple[int, tuple[int, ...], tuple[int, ...], int]] = []
        self.functions: dict[int, Any] = {}
        self.failed = 0

    def load(self, device: int, image: bytes, entry: str, shared_bytes: int, args: Sequence[LaunchArg]) -> Any:
        function = super().load(device, image, entry, shared_bytes, args)
        self.functions[HANDLE] = function
        return function

    @property
    def python_launches(self) -> int:
        """Launches the Python path made (`launches` holds every launch, the compiled ones too)."""
        return len(self.launches) - len(self.compiled)

    def function_handle(self, function: Any) -> int:
        assert function is self.functions[HANDLE]
        return HANDLE

    def raw(self, f: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: Any,
            params: Any, extra: Any) -> int:  # fmt: skip
        """cuLaunchKernel as the C++ side calls it: x and y pointers, then the int32 rows and cols."""
        x, y = (ctypes.c_uint64.from_address(params[i]).value for i in range(2))
        rows, cols = (ctypes.c_int32.from_address(params[i]).value for i in range(2, 4))
        if self.result:
            self.failed += 1
            return self.result
        self.compiled.append((f, (gx, gy, gz), (bx, by, bz), shared))
        self.launch({"rows": rows, "cols": cols}, (gx, gy, gz), (bx, by, bz), shared, 0, [x, y])
        return 0


@pytest.fixture
def driver() -> Iterator[HandleHostSoftmax]:
    made = HandleHostSoftmax()
    assert launchers.load_library() == ""
    callback = LAUNCH(made.raw)
    launchers.hook(int(ctypes.cast(callback, ctypes.c_void_p).value or 0))
    try:
        yield made
    finally:
        launchers.hook(0)


def _cast(tmp_path: Path, driver: HostSoftmax, **options: Any) -> Cast:
    path = write_cast(tmp_path / "model.cast", [softmax_entry(alignment=64)], machine=HERE)
    return load(path, machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver, **options)


def test_the_launcher_builds_into_the_cache_keyed_by_source_torch_and_compiler() -> None:
    assert launchers.load_library() == ""
    where = launchers.build_dir()
    assert isinstance(where, Path) and (where / "kernelforge_launcher.so").is_file()
    assert where.parent == launchers.cache_root() / "launcher"


def test_processes_that_start_together_on_a_damaged_library_each_load_a_whole_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Test workers or ranks that start at once share one cache: none may load a library another is still writing,
    and a library a killed build left half-written is built again, not reported as a failure for good."""
    monkeypatch.setenv("KERNELFORGE_CACHE_DIR", str(tmp_path))
    where = launchers.build_dir()
    assert isinstance(where, Path)
    where.mkdir(parents=True)
    (where / "kernelforge_launcher.so").write_bytes(b"\x7fELF half-written")
    loads = "from kernelforge_tui.cast import launcher; print(repr(launcher.load_library()))"
    started = [
        subprocess.Popen([sys.executable, "-c", loads], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        for _ in range(2)
    ]
    said = [process.communicate(timeout=300)[0].strip() for process in started]
    assert said == ["''", "''"]
    assert (where / "kernelforge_launcher.so").stat().st_size > 100_000
    assert sorted(path.name for path in where.iterdir()) == ["kernelforge_launcher.so"]  # no staging left behind


def test_without_a_compiler_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert launchers.build_dir() == "no C++ compiler ('no-such-compiler-here' is not on PATH; set CXX)"


def test_a_decided_signature_is_replayed_from_cpp(tmp_path: Path, driver: HandleHostSoftmax) -> None:
    x = torch.randn(4, 8)
    with _cast(tmp_path, driver) as cast:
        ys = [torch.softmax(x, -1) for _ in range(4)]
    assert all(torch.allclose(y, torch.softmax(x, -1)) for y in ys)
    assert driver.python_launches == 1  # the first call: the Python guard decides and launches
    assert len(driver.compiled) == 3 and driver.compiled[0] == (HANDLE, (4, 1, 1), (32, 1, 1), 0)
    stats = cast.stats()
    assert stats.launcher == "compiled" and stats.kernels[0].hits == 4
    assert "launcher: compiled" in cast.report()


def test_an_unseen_signature_falls_back_and_a_refusal_is_replayed(tmp_path: Path, driver: HandleHostSoftmax) -> None:
    x, other = torch.randn(4, 8), torch.randn(3, 8)
    with _cast(tmp_path, driver) as cast:
        torch.softmax(x, -1)
        refused = [torch.softmax(other, -1)]  # decided in Python, then the original kernel from C++
        doubles = [torch.softmax(x.double(), -1)]
        (override,) = cast.overrides()
        override.decisions.clear()  # the Python path would decide them again: it never sees them
        refused += [torch.softmax(other, -1) for _ in range(2)]
        doubles += [torch.softmax(x.double(), -1)]
        assert not override.decisions
    assert all(torch.equal(y, torch.softmax(other, -1)) for y in refused)
    assert all(torch.equal(y, torch.softmax(x.double(), -1)) for y in doubles)
    assert driver.python_launches == 1 and not driver.compiled
    stats = cast.stats()
    assert stats.overloads[0].uncovered == {"shape [3, 8] float32": 3}
    assert stats.kernels[0].fallbacks == {"dtype self float64 (kernel: float32)": 2}


def test_a_misaligned_pointer_and_a_launch_error_take_the_python_path(tmp_path: Path) -> None:
    driver = HandleHostSoftmax(result=1)  # every compiled launch fails: the Python path launches the call
    callback = LAUNCH(driver.raw)
    assert launchers.load_library() == ""
    launchers.hook(int(ctypes.cast(callback, ctypes.c_void_p).value or 0))
    x = torch.randn(4, 8)
    misaligned = torch.randn(4 * 8 + 1)[1:].view(4, 8)
    try:
        with _cast(tmp_path, driver) as cast:
            ys = [torch.softmax(x, -1) for _ in range(3)]
            off = torch.softmax(misaligned, -1)
    finally:
        launchers.hook(0)
    assert all(torch.allclose(y, torch.softmax(x, -1)) for y in ys) and torch.equal(off, torch.softmax(misaligned, -1))
    assert driver.failed == 2 and driver.python_launches == 3
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 3 and kernel.fallbacks == {"self not 64-byte aligned (a view that starts mid-buffer)": 1}


def test_leaving_the_block_removes_the_replay_and_the_next_block_replays_its_decisions(
    tmp_path: Path, driver: HandleHostSoftmax
) -> None:
    x = torch.randn(4, 8)
    cast = _cast(tmp_path, driver)
    for _ in range(2):
        with cast:
            torch.softmax(x, -1), torch.softmax(x, -1)
        torch.softmax(x, -1)  # eager: neither kernel sees it
    assert driver.python_launches == 1 and len(driver.compiled) == 3
    assert cast.stats().kernels[0].hits == 4 and cast.stats().launcher == "compiled"


def test_a_disabled_kernel_leaves_the_replay(tmp_path: Path, driver: HandleHostSoftmax) -> None:
    x = torch.randn(4, 8)
    with _cast(tmp_path, driver) as cast:
        torch.softmax(x, -1), torch.softmax(x, -1)
        cast.runners[0].disable("at hit 2: test")
        after = [torch.softmax(x, -1) for _ in range(2)]
    assert all(torch.equal(y, torch.softmax(x, -1)) for y in after) and len(driver.compiled) == 1
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 2 and kernel.fallbacks == {"disabled: disagreed with eager in shadow mode": 2}


@pytest.mark.parametrize(
    ("env", "options", "says"),
    [
        ("off", {}, f"Python path: turned off by {launchers.ENV_LAUNCHER}=off"),
        ("", {"shadow_every": 2}, "Python path: shadow mode compares hits with eager in Python"),
    ],
)
def test_the_python_path_serves_when_turned_off_or_shadowing(
    tmp_path: Path, driver: HandleHostSoftmax, monkeypatch: pytest.MonkeyPatch, env: str, options: Any, says: str
) -> None:
    monkeypatch.setenv(launchers.ENV_LAUNCHER, env)
    x = torch.randn(4, 8)
    with _cast(tmp_path, driver, **options) as cast:
        [torch.softmax(x, -1) for _ in range(3)]
    assert driver.python_launches == 3 and not driver.compiled
    assert cast.stats().launcher == says and f"launcher: {says}" in cast.report()


def test_a_binding_without_handles_keeps_the_python_path(tmp_path: Path) -> None:
    x = torch.randn(4, 8)
    with _cast(tmp_path, HostSoftmax()) as cast:
        torch.softmax(x, -1)
    assert cast.stats().launcher == (
        "Python path: the host stand-in binding gives no CUfunction handle (cuda-bindings does)"
    )


def test_a_launcher_that_cannot_register_leaves_the_python_path_in_force(
    tmp_path: Path, driver: HandleHostSoftmax, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(replay: launchers.Replay) -> None:
        raise RuntimeError("no registration here\nmore")

    monkeypatch.setattr(launchers.Replay, "attach", refuse)
    x = torch.randn(4, 8)
    with _cast(tmp_path, driver) as cast:
        ys = [torch.softmax(x, -1) for _ in range(2)]
    assert all(torch.allclose(y, torch.softmax(x, -1)) for y in ys)
    assert driver.python_launches == 2 and not driver.compiled and cast.stats().kernels[0].hits == 2
    assert cast.stats().launcher == "Python path: the compiled launcher could not be registered: no registration here"
