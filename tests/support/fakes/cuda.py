"""A stand-in for `pycuda.driver` over host memory, so the GPU worker's own code runs on a CPU machine.

Device memory is one flat byte array; pointers are offsets into it (plus a base, so none is 0). The helper
kernels (`kf_count_diff`, `kf_compare_*`, `kf_noise_*`) are NumPy versions of helpers.cu with the same results
layout; a candidate "cubin" is a Python function named by the cubin's file stem in `KERNELS`. Only the calls the
worker makes exist, with pycuda's signatures; timings are a fixed 0.1 ms per event pair.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

BASE = 1 << 20
HEAP_BYTES = 256 << 20

FLOAT_TYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
INT_RANGES = {
    "int32": (np.int32, -1000, 1000),
    "int64": (np.int64, -1000, 1000),
    "int8": (np.int8, -128, 127),
    "uint8": (np.uint8, 0, 255),
    "bool": (np.bool_, 0, 1),
}
"""kf_noise_<dtype>'s range for each integer dtype (helpers.cu)."""


class Error(Exception):
    """pycuda.driver.Error"""


class Memory:
    """The device: a bump allocator over one byte array."""

    def __init__(self) -> None:
        self.heap = np.zeros(HEAP_BYTES, dtype=np.uint8)
        self.top = 0

    def alloc(self, nbytes: int) -> Allocation:
        start = self.top
        self.top += (nbytes + 255) // 256 * 256
        if self.top > HEAP_BYTES:
            raise Error("out of memory")
        return Allocation(BASE + start)

    def bytes(self, ptr: int, nbytes: int) -> np.ndarray:
        start = int(ptr) - BASE
        return self.heap[start : start + nbytes]

    def view(self, ptr: int, dtype: Any, count: int) -> np.ndarray:
        return self.bytes(ptr, count * np.dtype(dtype).itemsize).view(dtype)


MEMORY = Memory()


class Allocation:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __int__(self) -> int:
        return self.ptr

    def __index__(self) -> int:
        return self.ptr


def reset() -> None:
    """A fresh device (each test starts with empty memory)."""
    global MEMORY
    MEMORY = Memory()


# -- memory calls -------------------------------------------------------------------------------------------


def init() -> None:
    return None


def mem_alloc(nbytes: int) -> Allocation:
    return MEMORY.alloc(nbytes)


def mem_get_info() -> tuple[int, int]:
    return HEAP_BYTES - MEMORY.top, HEAP_BYTES


def _fill(dest: Any, data: int, count: int, dtype: Any) -> None:
    MEMORY.view(int(dest), dtype, count)[:] = data


def memset_d8(dest: Any, data: int, count: int) -> None:
    _fill(dest, data, count, np.uint8)


def memset_d8_async(dest: Any, data: int, count: int, stream: Any = None) -> None:
    _fill(dest, data, count, np.uint8)


def memset_d16_async(dest: Any, data: int, count: int, stream: Any = None) -> None:
    _fill(dest, data, count, np.uint16)


def memset_d32(dest: Any, data: int, count: int) -> None:
    _fill(dest, data, count, np.uint32)


def memset_d32_async(dest: Any, data: int, count: int, stream: Any = None) -> None:
    _fill(dest, data, count, np.uint32)


def memcpy_htod(dest: Any, src: np.ndarray) -> None:
    raw = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
    MEMORY.bytes(int(dest), raw.size)[:] = raw


def memcpy_dtod(dest: Any, src: Any, size: int) -> None:
    MEMORY.bytes(int(dest), size)[:] = MEMORY.bytes(int(src), size).copy()


def memcpy_dtod_async(dest: Any, src: Any, size: int, stream: Any = None) -> None:
    memcpy_dtod(dest, src, size)


def memcpy_dtoh_async(dest: np.ndarray, src: Any, stream: Any = None) -> None:
    dest.view(np.uint8).reshape(-1)[:] = MEMORY.bytes(int(src), dest.nbytes)


# -- device, context, stream, events ------------------------------------------------------------------------

device_attribute = types.SimpleNamespace(MULTIPROCESSOR_COUNT="sms", L2_CACHE_SIZE="l2")
function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="max_dynamic_shared")


class Context:
    def synchronize(self) -> None:
        return None

    def pop(self) -> None:
        return None


class Device:
    def __init__(self, index: int) -> None:
        self.index = index

    def make_context(self) -> Context:
        return Context()

    def get_attribute(self, attribute: str) -> int:
        return {"sms": 132, "l2": 60 << 20}[attribute]


class Stream:
    def synchronize(self) -> None:
        return None


class Event:
    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def time_since(self, other: Event) -> float:
        return 0.1


# -- kernels ------------------------------------------------------------------------------------------------

Kernel = Callable[..., None]
"""A candidate: called with the launch's arguments (pointers as ints, scalars as NumPy numbers)."""
KERNELS: dict[str, Callable[[], Kernel]] = {}
"""Cubin stem -> a kernel factory, called per module load (a module's globals start afresh, as on a GPU)."""


class Function:
    def __init__(self, run: Kernel) -> None:
        self.run = run

    def prepare(self, arg_types: str) -> None:
        return None

    def set_attribute(self, attribute: str, value: int) -> None:
        return None

    def prepared_async_call(self, grid: Any, block: Any, stream: Any, *args: Any, shared_size: int = 0) -> None:
        self.run(*(int(a) if isinstance(a, np.uintp) else a for a in args))

    def __call__(self, *args: Any, block: Any = None, grid: Any = None, stream: Any = None) -> None:
        self.run(*args)


def _count_diff(a: Any, b: Any, value: Any, n: Any, result: Any) -> None:
    left = MEMORY.bytes(int(a), int(n))
    right = MEMORY.bytes(int(b), int(n)) if int(b) else np.full(int(n), int(value), dtype=np.uint8)
    differ = np.flatnonzero(left != right)
    words = MEMORY.view(int(result), np.uint64, 2)
    words[0] = differ.size
    if differ.size:
        words[1] = differ[0]


def _compare(dtype: Any) -> Kernel:
    def compare(out: Any, ref: Any, n: Any, rtol: Any, atol: Any, poison: Any, result: Any) -> None:
        raw = MEMORY.view(int(out), dtype, int(n))
        o = raw.astype(np.float64)
        e = MEMORY.view(int(ref), dtype, int(n)).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            finite = ~np.isnan(o) & ~np.isnan(e) & ~np.isinf(o) & ~np.isinf(e)
            diff = np.where(finite, np.abs(o - e), 0.0)
            allowed = float(atol) + float(rtol) * np.abs(np.where(finite, e, 0.0))
            within = np.where(finite, diff <= allowed, o == e)  # infinities must match exactly
            ok = np.where(np.isnan(e), np.isnan(o), ~np.isnan(o) & within)
        bad = np.flatnonzero(~ok)
        special = ~ok & ~np.isfinite(e)
        poisoned = ~ok & ~special & (raw.view(f"u{raw.itemsize}") == int(poison))
        nan_out = ~ok & ~special & ~poisoned & np.isnan(o)
        inf_out = ~ok & ~special & np.isinf(o)
        words = MEMORY.view(int(result), np.uint64, 8)
        words[0], words[1] = bad.size, int(nan_out.sum())
        if bad.size:
            words[2] = bad[0]
        ratio = np.where(finite, diff / allowed, 0.0)
        words[3:5] = np.array([diff.max(initial=0.0), ratio.max(initial=0.0)]).view(np.uint64)
        words[5:8] = [int(poisoned.sum()), int(inf_out.sum()), int(special.sum())]

    return compare


def _noise(dtype: str) -> Kernel:
    """Random finite values from the seed, in kf_noise_<dtype>'s ranges (not its bits: a NumPy generator)."""

    def noise(out: Any, n: Any, seed: Any) -> None:
        rng = np.random.default_rng(int(seed))
        if dtype in FLOAT_TYPES:
            MEMORY.view(int(out), FLOAT_TYPES[dtype], int(n))[:] = rng.uniform(-4.0, 4.0, int(n))
            return
        kind, low, high = INT_RANGES[dtype]
        MEMORY.view(int(out), kind, int(n))[:] = rng.integers(low, high, int(n), endpoint=True)

    return noise


class Module:
    def __init__(self, path: Path) -> None:
        self.path = path

    def get_function(self, name: str) -> Function:
        if name == "kf_count_diff":
            return Function(_count_diff)
        if name.startswith("kf_compare_"):
            return Function(_compare(FLOAT_TYPES[name.removeprefix("kf_compare_")]))
        if name.startswith("kf_noise_"):
            return Function(_noise(name.removeprefix("kf_noise_")))
        return Function(KERNELS[self.path.stem]())


def module_from_file(path: str) -> Module:
    return Module(Path(path))


def view(ptr: int, dtype: Any, count: int) -> np.ndarray:
    """A kernel's typed view of device memory."""
    return MEMORY.view(ptr, dtype, count)
