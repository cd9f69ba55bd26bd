"""The launch's argument block for cuLaunchKernel, and the binding lookup, without a GPU."""

from __future__ import annotations

import ctypes
import importlib.util

import pytest

from kernelforge_tui.cast import driver as drivers
from kernelforge_tui.cast.manifest import CastError, LaunchArg


def test_the_argument_block_points_at_each_parameter_in_order() -> None:
    args = [
        LaunchArg(kind="tensor", name="x"),
        LaunchArg(kind="scalar", name="rows", scalar_type="int32", value=21),
        LaunchArg(kind="tensor", name="y"),
        LaunchArg(kind="scalar", name="n", scalar_type="int64", value=2**40),
        LaunchArg(kind="scalar", name="scale", scalar_type="float32", value=0.5),
    ]
    params = drivers._Params(args)
    params.tensor_slots[0].value, params.tensor_slots[1].value = 0xDEAD0000, 0xBEEF0000
    pointers = (ctypes.c_void_p * 5).from_address(params.address)
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0xDEAD0000
    assert ctypes.c_int32.from_address(pointers[1]).value == 21
    assert ctypes.c_uint64.from_address(pointers[2]).value == 0xBEEF0000
    assert ctypes.c_int64.from_address(pointers[3]).value == 2**40
    assert ctypes.c_float.from_address(pointers[4]).value == 0.5


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
