"""The launch's argument blocks and prepared launches (what cuLaunchKernelEx / cuLaunchKernel receive, read back
through a stand-in of the driver function), and the binding lookup, without a GPU."""

from __future__ import annotations

import ctypes
import enum
import importlib.util
import threading

import pytest

from kernelforge_tui.cast import driver as drivers
from kernelforge_tui.cast.manifest import CastError, LaunchArg

ARGS = [
    LaunchArg(kind="tensor", name="x"),
    LaunchArg(kind="scalar", name="rows", scalar_type="int32", value=21),
    LaunchArg(kind="tensor", name="y"),
    LaunchArg(kind="scalar", name="n", scalar_type="int64", value=2**40),
    LaunchArg(kind="scalar", name="scale", scalar_type="float32", value=0.5),
]


def _parameters(address: int, count: int) -> list[int]:
    """The addresses a kernelParams array at `address` points at."""
    return list((ctypes.c_void_p * count).from_address(address))


def test_the_argument_block_points_at_each_parameter_in_order() -> None:
    block = drivers._Params(ARGS).block()
    block.pointers[:] = [0xDEAD0000, 0xBEEF0000]
    pointers = _parameters(block.address, 5)
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0xDEAD0000
    assert ctypes.c_int32.from_address(pointers[1]).value == 21
    assert ctypes.c_uint64.from_address(pointers[2]).value == 0xBEEF0000
    assert ctypes.c_int64.from_address(pointers[3]).value == 2**40
    assert ctypes.c_float.from_address(pointers[4]).value == 0.5
    with pytest.raises(ValueError):  # the tensors' count is the kernel's: a launch cannot pass one too few
        block.pointers[:] = [0xDEAD0000]


def test_each_thread_has_its_own_block() -> None:
    params = drivers._Params(ARGS)
    here = params.block()
    assert params.block() is here
    there: list[drivers._Block] = []
    worker = threading.Thread(target=lambda: there.append(params.block()))
    worker.start()
    worker.join()
    assert there[0] is not here and there[0].address != here.address


class Recorder:
    """A stand-in of the driver's launch function (ctypes calls it with the prepared objects): what each launch
    passed, read back from memory as the driver would read it."""

    def __init__(self, result: int = 0) -> None:
        self.result = result
        self.calls: list[dict[str, object]] = []

    def __call__(self, *args: object) -> int:
        extended = len(args) == 4
        if extended:
            config_p, function, params, extra = args
            config = config_p.contents  # type: ignore[attr-defined]  # a pointer to the stream's launch config
            grid = (config.grid_x, config.grid_y, config.grid_z)
            block = (config.block_x, config.block_y, config.block_z)
            shared, stream = config.shared_bytes, config.stream or 0
            assert config.attrs is None and config.num_attrs == 0
        else:
            function, gx, gy, gz, bx, by, bz, shm, stream_p, params, extra = args
            grid = tuple(v.value for v in (gx, gy, gz))  # type: ignore[attr-defined]
            block = tuple(v.value for v in (bx, by, bz))  # type: ignore[attr-defined]
            shared = shm.value  # type: ignore[attr-defined]
            stream = stream_p.value or 0  # type: ignore[attr-defined]
        assert isinstance(function, ctypes.c_void_p) and isinstance(params, ctypes.c_void_p) and extra is None
        assert params.value is not None
        slots = _parameters(params.value, 5)
        self.calls.append(
            {
                "function": function.value,
                "grid": grid,
                "block": block,
                "shared": shared,
                "stream": stream,
                "x": ctypes.c_uint64.from_address(slots[0]).value,
                "rows": ctypes.c_int32.from_address(slots[1]).value,
                "y": ctypes.c_uint64.from_address(slots[2]).value,
            }
        )
        return self.result


@pytest.mark.parametrize("extended", [True, False])
def test_a_prepared_launch_passes_the_plan_the_stream_and_the_pointers(extended: bool) -> None:
    recorder = Recorder()
    errors: list[tuple[int, int, list[int]]] = []
    launch = drivers.ctypes_launcher(
        drivers.RawLaunch(recorder, extended),
        0x7F00_0000_1000,
        (21, 2, 1),
        (256, 1, 1),
        4096,
        drivers._Params(ARGS),
        lambda error, stream, pointers: errors.append((error, stream, list(pointers))),
    )
    side = 0x5555_0000_1230
    launch(0, [0x1000, 0x2000])
    launch(side, [0x3000, 0x4000])
    launch(0, [0x5000, 0x6000])
    common = {"function": 0x7F00_0000_1000, "grid": (21, 2, 1), "block": (256, 1, 1), "shared": 4096, "rows": 21}
    assert recorder.calls == [
        {**common, "stream": 0, "x": 0x1000, "y": 0x2000},
        {**common, "stream": side, "x": 0x3000, "y": 0x4000},
        {**common, "stream": 0, "x": 0x5000, "y": 0x6000},
    ]
    assert errors == []
    recorder.result = 700  # CUDA_ERROR_ILLEGAL_ADDRESS: handed to on_error with the launch
    launch(side, [0x7000, 0x8000])
    assert errors == [(700, side, [0x7000, 0x8000])]


def test_the_launch_config_is_cudas() -> None:
    # CUlaunchConfig: seven unsigned ints, then the stream, the attributes and their count, 8-byte aligned.
    assert ctypes.sizeof(drivers.LaunchConfig) == 56
    assert drivers.LaunchConfig.stream.offset == 32 and drivers.LaunchConfig.num_attrs.offset == 48


def test_no_driver_library_means_the_bindings_own_launch() -> None:
    assert drivers.libcuda_launch(["libkernelforge-no-such-library.so"]) is None


def test_an_unknown_binding_is_named() -> None:
    with pytest.raises(CastError, match="unknown CUDA binding 'cupy'"):
        drivers.driver("cupy")


@pytest.mark.skipif(
    importlib.util.find_spec("cuda") is not None or importlib.util.find_spec("pycuda") is not None,
    reason="a CUDA binding is installed here",
)
def test_no_binding_says_what_to_install() -> None:
    with pytest.raises(CastError, match="pip install cuda-bindings"):
        drivers.driver()


class FakeCu:
    """A stand-in of `cuda.bindings.driver`: the calls CudaBindings makes, each launch's result from `results`."""

    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_CONTEXT = 201
        CUDA_ERROR_ILLEGAL_ADDRESS = 700

    def __init__(self, results: list[int]) -> None:
        self.results = results
        self.calls: list[tuple[object, ...]] = []

    def cuInit(self, flags: int) -> tuple[object, ...]:
        return (self.CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(self, *args: object) -> tuple[object, ...]:
        params = args[9]
        assert isinstance(params, int)
        slots = _parameters(params, 5)
        self.calls.append(("launch", args[8], ctypes.c_uint64.from_address(slots[0]).value))
        return (self.CUresult(self.results.pop(0)),)

    def cuCtxPushCurrent(self, context: object) -> tuple[object, ...]:
        self.calls.append(("push", context))
        return (self.CUresult.CUDA_SUCCESS,)

    def cuCtxPopCurrent(self) -> tuple[object, ...]:
        self.calls.append(("pop",))
        return (self.CUresult.CUDA_SUCCESS, None)


class Handle:
    def __int__(self) -> int:
        return 0x7F00_0000_2000


def _bindings(results: list[int], raw: drivers.RawLaunch | None) -> tuple[drivers.CudaBindings, FakeCu]:
    cu = FakeCu(results)
    binding = drivers.CudaBindings(cu, "test")
    binding._raw = raw if raw is not None else False
    return binding, cu


def test_a_launch_without_torchs_context_is_retried_in_it() -> None:
    # The ctypes launch finds no context current on this thread (201): cuda-bindings launches again inside the
    # function's context, pushed and popped around it.
    recorder = Recorder(result=201)
    binding, cu = _bindings([201, 0], drivers.RawLaunch(recorder, True))
    function = drivers._Function(Handle(), None, "torch's context", drivers._Params(ARGS))
    binding.launch(function, (21, 1, 1), (256, 1, 1), 0, 0x5555_0000, [0xAAAA0000, 0xBBBB0000])
    assert recorder.calls[0]["x"] == 0xAAAA0000 and recorder.calls[0]["function"] == 0x7F00_0000_2000
    assert cu.calls == [
        ("launch", 0x5555_0000, 0xAAAA0000),
        ("push", "torch's context"),
        ("launch", 0x5555_0000, 0xAAAA0000),
        ("pop",),
    ]
    assert binding.retries == 1


def test_a_failed_launch_says_what_the_driver_said() -> None:
    binding, _ = _bindings([], drivers.RawLaunch(Recorder(result=700), True))
    function = drivers._Function(Handle(), None, None, drivers._Params(ARGS))
    with pytest.raises(CastError, match=r"cuLaunchKernelEx failed: .*CUDA_ERROR_ILLEGAL_ADDRESS"):
        binding.launch(function, (21, 1, 1), (256, 1, 1), 0, 0, [1, 2])


def test_without_the_driver_library_the_bindings_launch() -> None:
    binding, cu = _bindings([0, 0], None)
    function = drivers._Function(Handle(), None, None, drivers._Params(ARGS))
    launch = binding.launcher(function, (21, 1, 1), (256, 1, 1), 0)
    assert binding.launcher(function, (21, 1, 1), (256, 1, 1), 0) is launch  # prepared once
    launch(0, [0xCCCC0000, 0xDDDD0000])
    assert cu.calls == [("launch", 0, 0xCCCC0000)]
