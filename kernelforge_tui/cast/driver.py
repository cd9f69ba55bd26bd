"""The CUDA driver calls the runtime makes: load a cubin into torch's own (primary) context, and launch a kernel on
torch's current stream. Two bindings, the first found wins:

- NVIDIA's cuda-bindings (`cuda.bindings.driver`): it loads the cubin into torch's context; the launch itself calls
  the driver's `cuLaunchKernelEx` (or `cuLaunchKernel`) through ctypes with everything but the tensors' pointers
  made at load, per kernel and stream (`ctypes_launcher`): the call passes four prepared objects, where
  cuda-bindings' own wrapper builds its argument objects on every call (about 5.9 us of host time per launch on the
  H200, against 8.3 us for an eager `torch.mul`). Where libcuda cannot be opened by name the launch goes through
  cuda-bindings' wrapper;
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
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kernelforge_tui.cast.manifest import CastError, LaunchArg
from kernelforge_tui.tensor_maps import MAP_ALIGNMENT, MAP_BYTES, TensorMap, TensorMapError, encode, struct_format

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

    # Optional: `launcher(function, grid, block, shared_bytes) -> Launcher`, the launch prepared once (the runtime
    # uses it where a binding has it, else `launch` with the plan's fixed arguments bound).


RETRY_ERRORS = frozenset({201, 400, 709})
"""CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_CONTEXT_IS_DESTROYED: no context, or another
one, is current on the calling thread; the launch is retried in the function's own (torch's primary) context."""
MAX_STREAMS = 64
"""Launch configs kept per launcher, one per stream (a program that makes streams without end starts over)."""
MAX_THREADS = 256
"""Argument blocks kept per kernel, one per thread (a program that makes threads without end starts over)."""


def map_over(spec: TensorMap, pointer: int) -> bytes:
    """The map over the tensor at `pointer` (which the guard admitted in the card's shape, so it holds what the map
    spans); CastError where the driver cannot encode it."""
    try:
        return encode(spec, pointer, spec.nbytes)
    except TensorMapError as exc:
        raise CastError(f"cannot launch: {exc}") from None


class _Block:
    """One argument block for cuLaunchKernel: the tensors' pointers in one array, the scalars (fixed at export), a
    64-byte aligned slot per tensor map, and the void* array pointing at each parameter in order."""

    def __init__(self, args: Sequence[LaunchArg]) -> None:
        count = sum(1 for a in args if a.kind == "tensor")
        self.pointers: ctypes.Array[Any] = (ctypes.c_uint64 * max(1, count))()
        """Rewritten before each launch (`pointers[:] = [...]`: one assignment, and the count must match)."""
        self.scalars: list[ctypes._SimpleCData[Any]] = []
        self.maps: list[tuple[int, TensorMap, int]] = []
        """(index among the pointers, map, slot address): the map is encoded into its slot from that pointer before
        each launch (`encode_maps`)."""
        self._slots = ctypes.create_string_buffer(MAP_BYTES * sum(1 for a in args if a.tensor_map) + MAP_ALIGNMENT)
        slot = -(-ctypes.addressof(self._slots) // MAP_ALIGNMENT) * MAP_ALIGNMENT
        addresses: list[int] = []
        tensor = 0
        for arg in args:
            if arg.tensor_map is not None:
                self.maps.append((tensor, arg.tensor_map, slot))
                addresses.append(slot)
                slot += MAP_BYTES  # a multiple of the alignment
                tensor += 1
            elif arg.kind == "tensor":
                addresses.append(ctypes.addressof(self.pointers) + tensor * ctypes.sizeof(ctypes.c_uint64))
                tensor += 1
            else:
                scalar = CTYPES[arg.scalar_type](arg.value)
                self.scalars.append(scalar)
                addresses.append(ctypes.addressof(scalar))
        self.array = (ctypes.c_void_p * max(1, len(addresses)))(*addresses)
        self.address = ctypes.addressof(self.array)
        self.handle = ctypes.c_void_p(self.address)
        """The `kernelParams` argument, made once."""

    def encode_maps(self, pointers: Sequence[int]) -> None:
        """Each tensor map of the launch encoded over its tensor's pointer (the guard admitted its shape, so the
        tensor holds what the map spans): a map holds its tensor's address."""
        for index, spec, slot in self.maps:
            ctypes.memmove(slot, map_over(spec, pointers[index]), MAP_BYTES)


class _Params:
    """A kernel's argument blocks, one per thread: the driver copies the arguments when it enqueues a launch, so a
    thread may rewrite its own block at every launch without a lock, and no other thread's launch (the GIL is let go
    during the driver call) can see it half written."""

    def __init__(self, args: Sequence[LaunchArg]) -> None:
        self.args = tuple(args)
        self.blocks: dict[int, _Block] = {}
        self.maps = any(a.tensor_map is not None for a in args)
        """Whether a launch encodes tensor maps (`_Block.encode_maps`) after writing its pointers."""

    def block(self) -> _Block:
        """This thread's block."""
        ident = threading.get_ident()
        block = self.blocks.get(ident)
        if block is None:
            if len(self.blocks) >= MAX_THREADS:  # threads come and go: their blocks are not kept for ever
                self.blocks.clear()
            block = self.blocks[ident] = _Block(self.args)
        return block


class _Function:
    def __init__(self, handle: Any, module: Any, context: Any, params: _Params) -> None:
        self.handle = handle
        self.module = module
        """Kept so the module lives as long as its function."""
        self.context = context
        self.params = params
        self.launchers: dict[tuple[Any, ...], Launcher] = {}
        """Prepared launches by (grid, block, shared bytes)."""


Launcher = Callable[[int, list[int]], None]
"""A prepared launch: called with torch's raw stream handle and the tensors' device pointers in the order of the
kernel's tensor parameters."""


class LaunchConfig(ctypes.Structure):
    """CUDA's CUlaunchConfig (cuda.h, CUDA 12.0 and later): what `cuLaunchKernelEx` takes in place of
    cuLaunchKernel's seven launch arguments and the stream."""

    _fields_ = [
        ("grid_x", ctypes.c_uint),
        ("grid_y", ctypes.c_uint),
        ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint),
        ("block_y", ctypes.c_uint),
        ("block_z", ctypes.c_uint),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


class RawLaunch:
    """A ctypes function of the driver's launch API, declared without argtypes (its arguments are ctypes objects
    made at load, so a call converts nothing): `cuLaunchKernelEx(config, f, kernelParams, extra)` when `extended`,
    else `cuLaunchKernel(f, grid x3, block x3, sharedMemBytes, hStream, kernelParams, extra)`."""

    def __init__(self, function: Any, extended: bool) -> None:
        self.function = function
        self.extended = extended


def ctypes_launcher(
    raw: RawLaunch,
    handle: int,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_bytes: int,
    params: _Params,
    on_error: Callable[[int, int, Sequence[int]], None],
) -> Launcher:
    """One kernel's launch through the driver's own launch function (`raw`). Made here, once: the function handle,
    per stream the launch config (or the stream's handle, for cuLaunchKernel), per thread the argument block with
    its scalars. Per launch: the tensors' pointers written into the thread's block in one assignment and one driver
    call with prepared arguments. A nonzero result goes to `on_error(result, stream, pointers)`, which retries or
    raises."""
    call = raw.function
    function = ctypes.c_void_p(handle)
    blocks = params.blocks
    maps = params.maps
    ident = threading.get_ident
    per_stream: dict[int, Any] = {}
    """Stream handle -> a pointer to its launch config (cuLaunchKernelEx; the pointer object holds the config, so a
    launch in flight keeps its own when the table starts over) or the handle as a ctypes pointer."""

    def for_stream(stream: int) -> Any:
        if len(per_stream) >= MAX_STREAMS:
            per_stream.clear()
        if raw.extended:
            made: Any = ctypes.pointer(LaunchConfig(*grid, *block, shared_bytes, stream, None, 0))
        else:
            made = ctypes.c_void_p(stream)
        per_stream[stream] = made
        return made

    if raw.extended:

        def launch(stream: int, pointers: list[int]) -> None:
            config = per_stream.get(stream)
            if config is None:
                config = for_stream(stream)
            own = blocks.get(ident())
            if own is None:
                own = params.block()
            own.pointers[:] = pointers
            if maps:
                own.encode_maps(pointers)
            error = call(config, function, own.handle, None)
            if error:
                on_error(error, stream, pointers)

        return launch

    gx, gy, gz = (ctypes.c_uint(v) for v in grid)
    bx, by, bz = (ctypes.c_uint(v) for v in block)
    shared = ctypes.c_uint(shared_bytes)

    def launch_plain(stream: int, pointers: list[int]) -> None:
        handle_of_stream = per_stream.get(stream)
        if handle_of_stream is None:
            handle_of_stream = for_stream(stream)
        own = blocks.get(ident())
        if own is None:
            own = params.block()
        own.pointers[:] = pointers
        if maps:
            own.encode_maps(pointers)
        error = call(function, gx, gy, gz, bx, by, bz, shared, handle_of_stream, own.handle, None)
        if error:
            on_error(error, stream, pointers)

    return launch_plain


def libcuda_launch(names: Sequence[str] = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")) -> RawLaunch | None:
    """The driver library's own launch function through ctypes (the library torch and cuda-bindings have already
    loaded): `cuLaunchKernelEx` (drivers for CUDA 12.0 and later), else `cuLaunchKernel`; None where the library
    cannot be opened by name."""
    for name in names:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        for symbol, extended in (("cuLaunchKernelEx", True), ("cuLaunchKernel", False)):
            function = getattr(library, symbol, None)
            if function is not None:
                function.restype = ctypes.c_int
                return RawLaunch(function, extended)
    return None


class CudaBindings:
    """NVIDIA's cuda-bindings: `cuda.bindings.driver` (or `cuda.cuda` of older cuda-python)."""

    def __init__(self, module: Any, version: str) -> None:
        self.cu = module
        self.name = f"cuda-bindings {version}"
        self._check(self.cu.cuInit(0), "cuInit")
        self._contexts: dict[int, Any] = {}
        self._success = self.cu.CUresult.CUDA_SUCCESS
        self._raw: RawLaunch | bool | None = None
        """libcuda's launch function through ctypes once looked up; False where it cannot be opened."""
        self.retries = 0
        """Launches made again inside the function's context (none was current on the thread, or another): each
        costs cuda-bindings' own launch and a context push and pop; a benchmark says how many there were."""

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

    def function_handle(self, function: Any) -> int:
        """A loaded kernel's CUfunction as an integer: what the compiled launcher (`cast.launcher`) launches."""
        return int(function.handle)

    def launcher(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int
    ) -> Launcher:
        """The kernel's launch, prepared once (`ctypes_launcher`): per call, one driver call and nothing built."""
        key = (grid, block, shared_bytes)
        known: Launcher | None = function.launchers.get(key)
        if known is not None:
            return known
        if self._raw is None:
            self._raw = libcuda_launch() or False
        prepared: Launcher
        if not isinstance(self._raw, RawLaunch):

            def through_binding(stream: int, pointers: list[int]) -> None:
                self._binding_launch(function, grid, block, shared_bytes, stream, pointers)

            prepared = through_binding
        else:

            def on_error(error: int, stream: int, pointers: Sequence[int]) -> None:
                if error in RETRY_ERRORS:
                    self._binding_launch(function, grid, block, shared_bytes, stream, pointers)
                    return
                what = "cuLaunchKernelEx" if raw.extended else "cuLaunchKernel"
                raise CastError(f"{what} failed: {self._name(error)}")

            raw = self._raw
            prepared = ctypes_launcher(raw, int(function.handle), grid, block, shared_bytes, function.params, on_error)
        function.launchers[key] = prepared
        return prepared

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: int,
        pointers: Sequence[int],
    ) -> None:
        self.launcher(function, grid, block, shared_bytes)(stream, list(pointers))

    def _name(self, error: Any) -> str:
        try:
            return repr(self.cu.CUresult(int(error)))
        except ValueError:
            return f"CUresult {int(error)}"

    def _binding_launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: int,
        pointers: Sequence[int],
    ) -> None:
        """cuda-bindings' own cuLaunchKernel: where libcuda is not open to ctypes, and to retry a launch in the
        function's context."""
        params = function.params.block()
        params.pointers[:] = list(pointers)
        params.encode_maps(pointers)
        (error,) = self.cu.cuLaunchKernel(function.handle, *grid, *block, shared_bytes, stream, params.address, 0)
        if error != self._success and int(error) in RETRY_ERRORS:
            # No context, or another one, is current on this thread: launch in torch's, then give the thread back
            # its own (torch's idea of the current device must not change under the user).
            self.retries += 1
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


def _pycuda_code(arg: LaunchArg) -> str:
    """The argument's code in pycuda's parameter buffer (`tensor_maps.struct_format`)."""
    if arg.tensor_map is not None:
        return "map"
    return "P" if arg.kind == "tensor" else PYCUDA_CODES[arg.scalar_type]


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
            function.prepare(struct_format([_pycuda_code(a) for a in args]))
        except self.drv.Error as exc:
            raise CastError(f"pycuda could not load {entry}: {exc}") from None
        finally:
            context.pop()
        template = [None if a.kind == "tensor" else CTYPES[a.scalar_type](a.value).value for a in args]
        return (function, context, module, template, [a.tensor_map for a in args if a.kind == "tensor"])

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
        kernel, context, _, template, maps = function
        tensors = iter(p if spec is None else map_over(spec, p) for p, spec in zip(pointers, maps, strict=True))
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
