"""The compiled launcher: the .cast runtime's hot path in C++ (`cast/cpp/launcher.cpp`), so that an overridden
eager call costs about what eager's own dispatch costs, not a round trip into Python.

Per overridden overload, a boxed C++ kernel goes in front of the runtime's Python kernel, at the same dispatch key.
It replays the decisions the Python guard made, per call signature (the dispatcher's whole stack: each tensor's
sizes, strides, dtype and device, every other argument's type and value): for an admitted one, it checks the
pointers' alignment, allocates the outputs (`at::empty_strided`) and calls the driver's cuLaunchKernel (through
dlopen, never linked) on torch's current stream; for a refused one, it calls the overload's original kernel. A
signature it has not seen, a misaligned pointer or a launch error go to the Python kernel, which decides (the one
place that does), counts, and tells the C++ table what it decided (`Replay.admit`, `Replay.refuse`). Counters of
replayed calls are drained into the Python ones when the stats are read.

Built once per machine with torch's cpp_extension (which needs a C++ compiler and ninja) into the cache directory
(KERNELFORGE_CACHE_DIR, else the platform's user cache), keyed by the source, torch's version and the compiler;
later processes load the built library. Processes that start together (test workers, ranks) take turns through a
lock file beside it; each build runs in a staging directory of its own and the library is renamed into place whole,
so no process loads a half-written one, and a library that does not load is built again. Where it cannot be built,
or with KERNELFORGE_CAST_LAUNCHER=off, the Python path serves every call, and `Cast.stats().launcher` says why.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from kernelforge_tui.cast import driver as drivers

if TYPE_CHECKING:
    from collections import Counter

    from kernelforge_tui.cast.runtime import KernelRunner

ENV_LAUNCHER = "KERNELFORGE_CAST_LAUNCHER"
"""`off` (or 0, false, no): every overridden call takes the Python path, the compiled launcher is not built."""
SOURCE = Path(__file__).with_name("cpp") / "launcher.cpp"
NAME = "kernelforge_launcher"

_LOCK = threading.Lock()
_STATE: list[str] = []
"""'' once the library is loaded in this process, else why it cannot be (tried once per process)."""


def cache_root() -> Path:
    """The cache directory the rest of kernelforge uses (`config.cache_dir`, which the runtime may not import)."""
    return Path(os.environ.get("KERNELFORGE_CACHE_DIR") or platformdirs.user_cache_dir("kernelforge"))


def _compiler() -> tuple[str, str] | str:
    """(the C++ compiler cpp_extension uses, its version line), or why there is none."""
    try:
        from torch.utils import cpp_extension
    except ImportError as exc:  # it needs setuptools
        return f"torch.utils.cpp_extension cannot be imported ({exc})"
    extension: Any = cpp_extension  # untyped
    name = str(extension.get_cxx_compiler())
    path = shutil.which(name)
    if path is None:
        return f"no C++ compiler ({name!r} is not on PATH; set CXX)"
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the C++ compiler {path} does not run: {exc}"
    return path, (version.splitlines() or ["?"])[0]


def build_dir() -> Path | str:
    """Where the library for this source, torch and compiler lives (built or not), or why it cannot be built."""
    import torch

    compiler = _compiler()
    if isinstance(compiler, str):
        return compiler
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(f"\0{torch.__version__}\0{compiler[0]}\0{compiler[1]}".encode())
    return cache_root() / "launcher" / key.hexdigest()[:20]


def load_library() -> str:
    """'' once the launcher's library is loaded (built first where it is not in the cache), else why not. Tried
    once per process: a failed build is not retried on every `with` block."""
    with _LOCK:
        if not _STATE:
            _STATE.append(_load())
        return _STATE[0]


def _load() -> str:
    where = build_dir()
    if isinstance(where, str):
        return where
    try:
        where.mkdir(parents=True, exist_ok=True)
        with open(where.with_name(where.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process dies
            _load_or_build(where / f"{NAME}.so")
    except (OSError, RuntimeError, ImportError, subprocess.SubprocessError) as exc:
        first = str(exc).strip().splitlines()
        return f"the compiled launcher did not build ({first[0] if first else type(exc).__name__}; see {where})"
    return ""


def _load_or_build(library: Path) -> None:
    """Load `library`; where it is missing or does not load, build it in a fresh staging directory (loading it from
    there), then rename it onto `library`."""
    import torch
    from torch.utils.cpp_extension import load

    if library.is_file():
        try:
            ops: Any = torch.ops  # untyped
            ops.load_library(str(library))
            return
        except OSError:
            library.unlink()  # damaged, or half-written by a build from before staging: built again
    staging = Path(tempfile.mkdtemp(prefix="build-", dir=library.parent))
    try:
        load(name=NAME, sources=[str(SOURCE)], build_directory=str(staging), is_python_module=False, verbose=False)
        os.replace(staging / library.name, library)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def hook(address: int) -> None:
    """Route every compiled launch through the function at `address` (cuLaunchKernel's C signature; tests give a
    stand-in); 0: libcuda's own cuLaunchKernel again."""
    import torch

    torch.ops.kernelforge_launcher.hook(address)


def scalar_bits(scalar_type: str, value: float | int) -> int:
    """A launch scalar as the int64 whose low bytes are its C value (what the C++ side copies into the argument)."""
    made = drivers.CTYPES[scalar_type](value)
    return int.from_bytes(bytes(made).ljust(8, b"\0"), "little", signed=True)


class Replay:
    """One overload's compiled kernel and its table of decisions. Made once, before the runtime's Python kernel is
    first registered (it keeps the overload's original kernel); in each `with` block attached after the Python
    kernel (it goes in front, and calls the Python kernel for what it does not hold) and detached before the Python
    kernel is removed. The table lasts across blocks, as the Python decisions do."""

    def __init__(self, overload: str, dispatch_key: str) -> None:
        """`overload`: `aten::NAME.OVERLOAD` (`aten::_softmax.default`)."""
        import torch

        name, _, which = overload.rpartition(".")
        self.ops: Any = torch.ops.kernelforge_launcher
        self.id = int(self.ops.create(name, "" if which == "default" else which, dispatch_key))
        self.attached = False
        release = weakref.finalize(self, self.ops.release, self.id)
        release.atexit = False  # at exit the process takes everything with it
        self.slots: list[tuple[KernelRunner | None, Counter[str], str]] = []
        """Per slot of the C++ counters: (the runner whose hits it counts, its fallbacks, ""), or (None, the
        counter and the reason a refusal is counted in)."""
        self._slot: dict[tuple[int, str], int] = {}

    def attach(self) -> None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": on purpose
            self.ops.attach(self.id)
        self.attached = True

    def detach(self) -> None:
        self.ops.detach(self.id)
        self.attached = False

    def slot(self, runner: KernelRunner | None, counter: Counter[str], reason: str) -> int:
        """The slot counting a runner's hits (`reason` ''), or a refusal's calls."""
        key = (id(runner if runner is not None else counter), reason)
        found = self._slot.get(key)
        if found is None:
            found = self._slot[key] = len(self.slots)
            self.slots.append((runner, counter, reason))
        return found

    def refuse(self, counter: Counter[str], reason: str) -> bool:
        """The call being decided on this thread was refused: later calls of its signature run the original."""
        return bool(self.ops.refuse(self.id, self.slot(None, counter, reason)))

    def admit(self, runner: KernelRunner, handle: int, placed: Sequence[tuple[int, int]]) -> bool:
        """The call being decided on this thread was admitted: later calls of its signature launch the kernel
        `handle` (a CUfunction) from C++. `placed`: each guarded tensor's (stack position, alignment)."""
        import torch

        launch = runner.entry.launch
        if any(getattr(arg, "tensor_map", None) is not None for arg in launch.args):
            return False  # the C++ replay passes raw pointers; a map is encoded per launch on the Python path
        inputs = len(placed)
        params: list[int] = []
        tensors = iter(runner.plan)
        for arg in launch.args:
            if arg.kind == "tensor":
                index = next(tensors)
                params += [0, placed[index][0]] if index < inputs else [1, index - inputs]
            else:
                params += [2, scalar_bits(arg.scalar_type, arg.value)]
        outputs = [
            torch.empty_strided(spec.shape, spec.strides, dtype=dtype, device="meta")
            for spec, (_, dtype) in zip(runner.entry.guard.outputs, runner.outputs, strict=True)
        ]
        return bool(
            self.ops.admit(
                self.id,
                self.slot(runner, runner.fallbacks, ""),
                handle,
                [*launch.grid, *launch.block, launch.shared_bytes],
                params,
                [v for pair in placed for v in pair],
                outputs,
                placed[0][0],
            )
        )

    def forget(self, runner: KernelRunner) -> None:
        """The runner is disabled: its signatures go to the Python path again (which refuses them). Their calls
        so far stay to be drained."""
        for slot, (owner, _, _) in enumerate(self.slots):
            if owner is runner:
                self.ops.forget(self.id, slot)

    def drain(self) -> list[tuple[KernelRunner | None, Counter[str], str, int]]:
        """The calls replayed since the last drain, per slot: (runner, counter, reason, calls)."""
        drained = list(self.ops.drain(self.id))
        return [(*self.slots[slot], calls) for slot, calls in zip(drained[::2], drained[1::2], strict=True)]


def gives_handles(driver: drivers.Driver) -> bool:
    """Whether the binding gives a loaded kernel's CUfunction as an integer (cuda-bindings does, pycuda not)."""
    return callable(getattr(driver, "function_handle", None))


def function_handle(driver: drivers.Driver, function: Any) -> int:
    """The CUfunction of a kernel the binding loaded, as an integer (a binding that `gives_handles`)."""
    return int(driver.function_handle(function))  # type: ignore[attr-defined]
