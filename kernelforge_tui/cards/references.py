"""Built-in NumPy reference implementations, by name, computed in float32 or wider.

A reference takes the inputs (as the card's dtypes) and the sizes and returns every output in float32
or float64; the card loader rounds them to the output dtype. Row-wise references work on blocks of
rows in float64 (accurate, and a 4096 x 32768 softmax takes well under a second instead of several)
and return float32, rounded once from the float64 result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Arrays = dict[str, np.ndarray]
ReferenceFn = Callable[[Arrays, dict[str, int]], Arrays]

CHUNK_ELEMENTS = 1 << 22
"""Elements per block of rows (32 MiB of float64): big enough to vectorise, small enough for the cache."""


def _f32(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32)


def _by_rows(x: np.ndarray, row_fn: Callable[[np.ndarray, slice], np.ndarray]) -> np.ndarray:
    """Apply `row_fn(rows as float64, row slice)` to blocks of rows of x viewed as 2-D; float32 result."""
    flat = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    out = np.empty(flat.shape, dtype=np.float32)
    step = max(1, CHUNK_ELEMENTS // max(1, flat.shape[1]))
    for start in range(0, flat.shape[0], step):
        rows = slice(start, start + step)
        out[rows] = row_fn(flat[rows].astype(np.float64), rows)
    return out.reshape(x.shape)


def vector_add(inputs: Arrays, sizes: dict[str, int]) -> Arrays:
    """c = a + b, added in fp32 as a kernel must (so the result is exact)."""
    return {"c": _f32(inputs["a"]) + _f32(inputs["b"])}


def softmax(inputs: Arrays, sizes: dict[str, int]) -> Arrays:
    """y = softmax(x) over the last axis, in float64. -inf entries are masked out (0); a row of -inf only
    (fully masked) is NaN, as torch.softmax gives; a NaN or +inf makes its row NaN."""

    def rows(block: np.ndarray, _: slice) -> np.ndarray:
        block -= block.max(axis=-1, keepdims=True)
        np.exp(block, out=block)
        block /= block.sum(axis=-1, keepdims=True)
        return block

    return {"y": _by_rows(inputs["x"], rows)}


def rms_norm(inputs: Arrays, sizes: dict[str, int], eps: float = 1e-6) -> Arrays:
    """y = x * rsqrt(mean(x^2) + eps) * w over the last axis, in float64. A NaN makes its row NaN; an inf
    makes rsqrt 0, so its row is 0 with NaN at the inf (inf * 0), as torch gives."""
    w = inputs["w"].astype(np.float64)

    def rows(block: np.ndarray, _: slice) -> np.ndarray:
        inv = 1.0 / np.sqrt(np.mean(np.square(block), axis=-1, keepdims=True) + eps)
        block *= inv
        block *= w
        return block

    return {"y": _by_rows(inputs["x"], rows)}


def layer_norm(inputs: Arrays, sizes: dict[str, int], eps: float = 1e-5) -> Arrays:
    """y = (x - mean) / sqrt(var + eps) * w + b over the last axis, in float64 (two-pass: no cancellation).
    A NaN or inf makes its row NaN."""
    w = inputs["w"].astype(np.float64)
    b = inputs["b"].astype(np.float64)

    def rows(block: np.ndarray, _: slice) -> np.ndarray:
        block -= block.mean(axis=-1, keepdims=True)
        block /= np.sqrt(np.mean(np.square(block), axis=-1, keepdims=True) + eps)
        block *= w
        block += b
        return block

    return {"y": _by_rows(inputs["x"], rows)}


BUILTIN: dict[str, ReferenceFn] = {
    "vector_add": vector_add,
    "softmax": softmax,
    "rms_norm": rms_norm,
    "layer_norm": layer_norm,
}
