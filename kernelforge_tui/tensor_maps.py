"""The harness's TMA tensor maps: a plan's `tensor_maps` encoded by the driver over the launch's own tensors.

Why the harness and not the candidate: a TMA copy reads a 128-byte CUtensorMap that only the host driver's
cuTensorMapEncodeTiled fills completely (bench/tma_probe.py: a map built on the device with tensormap.replace
leaves two derived words wrong), and a candidate never runs on the host. Why it is safe: the map holds the
tensor's base address, extent and strides, and every TMA copy through it is bounds-checked by the hardware against
them (what lies outside reads as zeros and is never written). The candidate chooses only the box, the swizzle and
the L2 promotion (cards.plan.tensor_map); the extent and strides are the card's tensor's and the address is the
buffer the harness allocated, so a copy through the map cannot reach outside its operand.

A map holds its tensor's address, so each launch passes maps encoded for the pointers it launches with: every place
that launches a candidate (the worker's checks and timing, the profiler's launch, the exported package's driver)
calls `encode` with the pointer at hand. Maps are kept by (map, address), so a pointer that repeats (a set's
buffer, a model's weight) is encoded once. Only the standard library and pydantic: the exported package's runtime
imports it (cards.plan makes the maps from a card and checks what the candidate chose).
"""

from __future__ import annotations

import ctypes
from functools import cache, lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict

TMA_DATA_TYPES = {
    "uint8": 0,
    "int8": 0,
    "bool": 0,
    "int32": 3,
    "int64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
    "bfloat16": 9,
}
"""A card dtype -> CUtensorMapDataType (cuda.h): the map copies the tensor's own elements (a byte type copies the
8-bit ones bit for bit)."""
TMA_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
"""Swizzle span in bytes -> CUtensorMapSwizzle."""
TMA_L2_PROMOTION = {0: 0, 64: 1, 128: 2, 256: 3}
"""L2 promotion in bytes -> CUtensorMapL2promotion."""
MAX_BOX = 256
MAX_TMA_DIM = 2**32
TMA_ALIGNMENT = 16
"""Bytes: a map's base address and every stride but the innermost (which is the element) are multiples of it."""


class TensorMap(BaseModel):
    """A TMA map as the harness encodes it (`encode`), every field but the base address known: the extent and the
    strides are the card's tensor's (row-major, contiguous), innermost dim first; the box, swizzle and L2 promotion
    are the plan's. Frozen and hashable: the encoder keeps the maps it made by (map, address)."""

    model_config = ConfigDict(frozen=True)

    tensor: str
    data_type: int
    element_bytes: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    """Bytes between consecutive indices of dims 1.. (dim 0 is contiguous)."""
    box: tuple[int, ...]
    swizzle: int
    """CUtensorMapSwizzle."""
    l2_promotion: int
    """CUtensorMapL2promotion."""

    @property
    def nbytes(self) -> int:
        """The bytes the map spans from its base: what the tensor's buffer must hold."""
        steps = [self.element_bytes, *self.strides]
        return self.element_bytes + sum((d - 1) * s for d, s in zip(self.dims, steps, strict=True))


MAP_BYTES = 128
MAP_ALIGNMENT = 64
"""A CUtensorMap is 64-byte aligned, in memory and among a kernel's parameters."""
INTERLEAVE_NONE = 0
OOB_FILL_NONE = 0
"""Outside the tensor a copy reads zeros (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), and never writes."""
KEPT = 1024


class TensorMapError(Exception):
    """A map the driver cannot encode over this pointer (misaligned, a buffer smaller than the map, a refusal)."""


@cache
def _encode_tiled() -> Any:
    """libcuda's cuTensorMapEncodeTiled through ctypes (the library the process's CUDA binding has loaded)."""
    try:
        library = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise TensorMapError(f"cannot open the CUDA driver library to encode tensor maps: {exc}") from None
    function = library.cuTensorMapEncodeTiled
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    function.restype = ctypes.c_int
    function.argtypes = [
        ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, ctypes.POINTER(u64), ctypes.POINTER(u64),
        ctypes.POINTER(u32), ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    return function


def check(spec: TensorMap, address: int, nbytes: int) -> None:
    """TensorMapError unless the map fits the buffer at `address` of `nbytes` bytes and its base is aligned."""
    if address % TMA_ALIGNMENT:
        raise TensorMapError(
            f"{spec.tensor} starts at {address:#x}, not on a 16-byte boundary: a TMA map cannot start there"
        )
    if spec.nbytes > nbytes:
        raise TensorMapError(f"the map of {spec.tensor} spans {spec.nbytes} bytes, its buffer holds {nbytes}")


@lru_cache(maxsize=KEPT)
def encode(spec: TensorMap, address: int, nbytes: int) -> bytes:
    """The 128 bytes of the map `spec` over the tensor at device `address`, whose buffer holds `nbytes` bytes."""
    check(spec, address, nbytes)
    rank = len(spec.dims)
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    raw = ctypes.create_string_buffer(MAP_BYTES + MAP_ALIGNMENT)
    aligned = -(-ctypes.addressof(raw) // MAP_ALIGNMENT) * MAP_ALIGNMENT
    status = _encode_tiled()(
        ctypes.c_void_p(aligned), spec.data_type, rank, ctypes.c_void_p(address), (u64 * rank)(*spec.dims),
        (u64 * max(1, rank - 1))(*spec.strides), (u32 * rank)(*spec.box), (u32 * rank)(*[1] * rank),
        INTERLEAVE_NONE, spec.swizzle, spec.l2_promotion, OOB_FILL_NONE,
    )  # fmt: skip
    if status != 0:
        raise TensorMapError(
            f"cuTensorMapEncodeTiled refused the map of {spec.tensor} (CUresult {status}): dims {list(spec.dims)}, "
            f"strides {list(spec.strides)}, box {list(spec.box)}, swizzle {spec.swizzle}"
        )
    return ctypes.string_at(aligned, MAP_BYTES)


def struct_format(codes: list[str]) -> str:
    """A kernel's parameter buffer as a `struct` format (native alignment, as pycuda packs it) from each parameter's
    code, "map" for a tensor map: 128 bytes, padded to its 64-byte alignment."""
    import struct

    made = ""
    for code in codes:
        if code == "map":
            made += f"{-struct.calcsize(made) % MAP_ALIGNMENT}x{MAP_BYTES}s"
        else:
            made += code
    return made
