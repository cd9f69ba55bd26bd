"""The CUDA driver calls the runtime makes: load a cubin into torch's own (primary) context, and launch a kernel on
torch's current stream. Two bindings, the first found wins:

- NVIDIA's cuda-bindings (`cuda.bindings.driver`): `cuLaunchKernel` on any stream handle, about 5.9 us of host
  time per launch on the H200 (against 8.3 us for an eager `torch.mul`);
- pycuda: its launches take only its own stream objects, so it launches on the legacy default stream (handle 0)
  and only while that is torch's current stream; on any other stream the call goes to the original operator.

Why the primary context: torch uses it, so the kernel sees torch's memory and runs in order with torch's work on
the same stream; a context of our own (pycuda.autoinit) would be a second world. Imports only the standard library
at module level; the binding is imported when the first kernel is loaded.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from kernelforge_tui.cast.manifest import CastError, LaunchArg

CTYPES: dict[str, type[ctypes._SimpleCData[Any]]] = {
    "int32": ctypes.c_int32,
    "int64": ctypes.c_int64,
    "uint32": ctypes.c_uint32,
    "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float,
}
PYCUDA_CODES = {"int32": "i", "int64": "q", "uint32": "I", "uint64": "Q", "float32": "f"}
MAX_STATIC_SHARED = 48 * 1024


class LaunchUnsupported(Exception):
    """This binding cannot launch here (pycuda on a non-default stream): the call falls back, with this reason."""


class Driver(Protocol):
    name: str

    def load(self, device: int, image: bytes, entry: str, shared_bytes: int, args: Sequence[LaunchArg]) -> Any:
        """A launchable function for `entry` of the cubin or PTX `image` on device index `device`."""

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: int,
        pointers: Sequence[int],
    ) -> None:
        """Launch with the tensors' device pointers, in the order of the plan's tensor arguments."""

    def driver_version(self) -> int:
        """cuDriverGetVersion: 12080 for a driver that supports CUDA 12.8."""


class _Params:
    """A kernel's argument block for cuLaunchKernel: one slot per parameter and the void* array pointing at them.
    Scalars are fixed at export; the tensor slots are rewritten before each launch, under the lock (the driver
    copies the values when the launch is enqueued, so one block per kernel is enough)."""

    def __init__(self, args: Sequence[LaunchArg]) -> None:
        self.slots: list[ctypes._SimpleCData[Any]] = []
        self.tensor_slots: list[ctypes.c_uint64] = []
        for arg in args:
            if arg.kind == "tensor":
                slot = ctypes.c_uint64(0)
                self.tensor_slots.append(slot)
                self.slots.append(slot)
            else:
                self.slots.append(CTYPES[arg.scalar_type](arg.value))
        self.array = (ctypes.c_void_p * max(1, len(self.slots)))(*[ctypes.addressof(s) for s in self.slots])
        self.address = ctypes.addressof(self.array)
        self.lock = threading.Lock()


class _Function:
    def __init__(self, handle: Any, module: Any, context: Any, params: _Params) -> None:
        self.handle = handle
        self.module = module
        """Kept so the module lives as long as its function."""
        self.context = context
        self.params = params


class CudaBindings:
    """NVIDIA's cuda-bindings: `cuda.bindings.driver` (or `cuda.cuda` of older cuda-python)."""

    def __init__(self, module: Any, version: str) -> None:
        self.cu = module
        self.name = f"cuda-bindings {version}"
        self._check(self.cu.cuInit(0), "cuInit")
        self._contexts: dict[int, Any] = {}
        self._retry = {
            int(self.cu.CUresult.CUDA_ERROR_INVALID_CONTEXT),
            int(self.cu.CUresult.CUDA_ERROR_INVALID_HANDLE),
            int(self.cu.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED),
        }
        self._success = self.cu.CUresult.CUDA_SUCCESS

    def _check(self, result: Any, what: str) -> Any:
        error = result[0]
        if error != self.cu.CUresult.CUDA_SUCCESS:
            raise CastError(f"{what} failed: {error!r}")
        return result[1] if len(result) == 2 else result[1:]

    def _context(self, device: int) -> Any:
        """The device's primary context (torch's), retained once."""
        if device not in self._contexts:
            handle = self._check(self.cu.cuDeviceGet(device), "cuDeviceGet")
            self._contexts[device] = self._check(self.cu.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")
        return self._contexts[device]

    def load(self, device: int, image: bytes, entry: str, shared_bytes: int, args: Sequence[LaunchArg]) -> Any:
        context = self._context(device)
        self._check(self.cu.cuCtxPushCurrent(context), "cuCtxPushCurrent")
        try:
            buffer = ctypes.create_string_buffer(image)  # NUL-terminated, as PTX text must be
            module = self._check(self.cu.cuModuleLoadData(ctypes.addressof(buffer)), "cuModuleLoadData")
            handle = self._check(self.cu.cuModuleGetFunction(module, entry.encode()), f"cuModuleGetFunction({entry})")
            if shared_bytes > MAX_STATIC_SHARED:
                attribute = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                (error,) = self.cu.cuFuncSetAttribute(handle, attribute, shared_bytes)
                if error != self._success:
                    raise CastError(f"cannot allow {shared_bytes} bytes of shared memory for {entry}: {error!r}")
        finally:
            self.cu.cuCtxPopCurrent()
        return _Function(handle, module, context, _Params(args))

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: int,
        pointers: Sequence[int],
    ) -> None:
        params = function.params
        with params.lock:
            for slot, pointer in zip(params.tensor_slots, pointers, strict=True):
                slot.value = pointer
            (error,) = self.cu.cuLaunchKernel(function.handle, *grid, *block, shared_bytes, stream, params.address, 0)
            if error != self._success and int(error) in self._retry:
                # No context, or another one, is current on this thread: launch in torch's, then give the thread
                # back its own (torch's idea of the current device must not change under the user).
                self._check(self.cu.cuCtxPushCurrent(function.context), "cuCtxPushCurrent")
                try:
                    (error,) = self.cu.cuLaunchKernel(
                        function.handle, *grid, *block, shared_bytes, stream, params.address, 0
                    )
                finally:
                    self.cu.cuCtxPopCurrent()
        if error != self._success:
            raise CastError(f"cuLaunchKernel failed: {error!r}")

    def driver_version(self) -> int:
        return int(self._check(self.cu.cuDriverGetVersion(), "cuDriverGetVersion"))


class PyCuda:
    """pycuda, on the legacy default stream only (it cannot launch on a stream it did not create)."""

    def __init__(self, drv: Any, version: str) -> None:
        self.drv = drv
        self.name = f"pycuda {version}"
        drv.init()
        self._contexts: dict[int, Any] = {}

    def load(self, device: int, image: bytes, entry: str, shared_bytes: int, args: Sequence[LaunchArg]) -> Any:
        if device not in self._contexts:
            self._contexts[device] = self.drv.Device(device).retain_primary_context()
        context = self._contexts[device]
        context.push()
        try:
            module = self.drv.module_from_buffer(image)
            function = module.get_function(entry)
            if shared_bytes > MAX_STATIC_SHARED:
                function.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
            function.prepare("".join("P" if a.kind == "tensor" else PYCUDA_CODES[a.scalar_type] for a in args))
        except self.drv.Error as exc:
            raise CastError(f"pycuda could not load {entry}: {exc}") from None
        finally:
            context.pop()
        template = [None if a.kind == "tensor" else CTYPES[a.scalar_type](a.value).value for a in args]
        return (function, context, module, template)

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: int,
        pointers: Sequence[int],
    ) -> None:
        if stream != 0:
            raise LaunchUnsupported("torch's current stream is not the default stream, and pycuda launches only there")
        kernel, context, _, template = function
        tensors = iter(pointers)
        values = [next(tensors) if value is None else value for value in template]
        try:
            kernel.prepared_call(grid, block, *values, shared_size=shared_bytes)
        except self.drv.Error:  # no context current on this thread: launch in torch's, then restore the thread's
            context.push()
            try:
                kernel.prepared_call(grid, block, *values, shared_size=shared_bytes)
            finally:
                context.pop()

    def driver_version(self) -> int:
        return int(self.drv.get_driver_version())


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


_DRIVERS: dict[str, Driver] = {}
"""The bindings created so far, by name ("cuda-bindings", "pycuda"): each initialised once per process."""
_LOCK = threading.Lock()
ORDER = ("cuda-bindings", "pycuda")

BINDING_HELP = (
    "no CUDA driver binding: install NVIDIA's cuda-bindings (pip install cuda-bindings, the one the runtime prefers) "
    "or pycuda (pip install 'kernelforge-tui[gpu]')"
)


def driver(prefer: str | None = None) -> Driver:
    """The binding `prefer` names ("cuda-bindings" or "pycuda"), else the first of them that imports (cuda-bindings
    first); each created once. CastError when none can be imported."""
    with _LOCK:
        order = [prefer] if prefer is not None else list(ORDER)
        for name in order:
            if name in _DRIVERS:
                return _DRIVERS[name]
        problems: list[str] = []
        for name in order:
            try:
                if name == "cuda-bindings":
                    try:
                        module = importlib.import_module("cuda.bindings.driver")
                    except ImportError:
                        module = importlib.import_module("cuda.cuda")
                    made: Driver = CudaBindings(module, _version("cuda-bindings"))
                elif name == "pycuda":
                    made = PyCuda(importlib.import_module("pycuda.driver"), _version("pycuda"))
                else:
                    raise CastError(f"unknown CUDA binding {name!r}: use one of {', '.join(ORDER)}")
            except ImportError as exc:
                problems.append(f"{name}: {exc}")
                continue
            _DRIVERS[name] = made
            return made
        raise CastError(f"{BINDING_HELP} ({'; '.join(problems)})")
