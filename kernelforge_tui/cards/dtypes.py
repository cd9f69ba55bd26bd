"""The dtypes a card may use, with their NumPy types, storage in .npz, and NaN poison patterns.

bf16 is first-class through `ml_dtypes`: NumPy's .npz cannot record it, so 16-bit floats are stored
as their raw uint16 bits and reinterpreted from the manifest's dtype on load.
"""

from __future__ import annotations

from typing import Literal

import ml_dtypes
import numpy as np

DType = Literal["float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8", "int8", "bool"]

NUMPY: dict[str, np.dtype[np.generic]] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "bool": np.dtype(np.bool_),
}

STORAGE: dict[str, np.dtype[np.generic]] = {**NUMPY, "bfloat16": np.dtype(np.uint16)}
"""How each dtype is written into an .npz file (bf16 as raw bits)."""

FLOATING = frozenset({"float32", "float16", "bfloat16", "float64"})

POISON_BITS: dict[str, int] = {
    "float32": 0x7FC00000,
    "float16": 0x7E00,
    "bfloat16": 0x7FC0,
    "float64": 0x7FF87FF87FF87FF8,
    "int32": 0x7EADBEEF,
    "int64": 0x7EAD7EAD7EAD7EAD,
    "uint8": 0xA5,
    "int8": 0x5A,
    "bool": 0xA5,
}
"""Bit pattern written over outputs before every launch: NaN for floats, an unlikely value otherwise. 8-byte
patterns repeat 16 bits (the driver's memsets write at most 32); the compare helper looks for the exact pattern."""

FLOAT_BITS: dict[str, tuple[int, int, int]] = {
    "float32": (0x7F7FFFFF, 0x00800000, 0x00000001),
    "float16": (0x7BFF, 0x0400, 0x0001),
    "bfloat16": (0x7F7F, 0x0080, 0x0001),
    "float64": (0x7FEFFFFFFFFFFFFF, 0x0010000000000000, 0x0000000000000001),
}
"""The largest finite value, the smallest normal and the smallest subnormal of each floating dtype, as bits."""


def float_limits(dtype: str) -> tuple[float, float, float]:
    """(largest finite, smallest normal, smallest subnormal) of a floating dtype."""
    bits = np.array(FLOAT_BITS[dtype], dtype=f"u{NUMPY[dtype].itemsize}")
    largest, normal, subnormal = (float(v) for v in bits.view(NUMPY[dtype]).astype(np.float64))
    return largest, normal, subnormal


def to_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """The array as it is written to .npz."""
    return np.ascontiguousarray(array.astype(NUMPY[dtype], copy=False)).view(STORAGE[dtype])


def from_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """The array as the card means it, from its .npz form."""
    if array.dtype != STORAGE[dtype]:
        raise TypeError(f"stored as {array.dtype}, expected {STORAGE[dtype]} for {dtype}")
    return array.view(NUMPY[dtype])
