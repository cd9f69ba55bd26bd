"""Built-in NumPy reference implementations, by name, computed in float32 or wider.

A reference takes the inputs (as the card's dtypes) and the sizes and returns every output in float32
or float64; the card loader rounds them to the output dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Arrays = dict[str, np.ndarray]
ReferenceFn = Callable[[Arrays, dict[str, int]], Arrays]


def _f32(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32)


def vector_add(inputs: Arrays, sizes: dict[str, int]) -> Arrays:
    return {"c": _f32(inputs["a"]) + _f32(inputs["b"])}


def softmax(inputs: Arrays, sizes: dict[str, int]) -> Arrays:
    x = inputs["x"].astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return {"y": x}


def rms_norm(inputs: Arrays, sizes: dict[str, int]) -> Arrays:
    x = _f32(inputs["x"])
    eps = 1e-6
    inv = 1.0 / np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True) + eps)
    y = (x * inv.astype(np.float32)) * _f32(inputs["w"])
    return {"y": y}


def layer_norm(inputs: Arrays, sizes: dict[str, int]) -> Arrays:
    x = inputs["x"].astype(np.float64)
    eps = 1e-5
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps) * _f32(inputs["w"]) + _f32(inputs["b"])
    return {"y": y}


BUILTIN: dict[str, ReferenceFn] = {
    "vector_add": vector_add,
    "softmax": softmax,
    "rms_norm": rms_norm,
    "layer_norm": layer_norm,
}
