"""Fused patterns: chains of aten calls that one card kernel replaces.

Why: some operators reach the dispatcher decomposed. `F.rms_norm` on the CPU (and every hand-written Llama RMSNorm:
`x.float().pow(2).mean(-1, keepdim=True)`, `+ eps`, `rsqrt`, two multiplies, casts) is six to eight calls, each a
full pass over the row; SwiGLU's `silu(gate) * up` is two. One kernel for the chain reads the inputs once and
writes the output once, which is where the time is. A chain is fused only when every intermediate is read by the
next call of the chain alone (nothing else in the model, nor its outputs, sees it), so a runtime that replaces
the chain computes everything the model uses.
"""

from __future__ import annotations

from kernelforge_tui.capture.calls import Call
from kernelforge_tui.capture.manifest import ArgSpec

FLOAT_TYPES = ("float32", "bfloat16", "float16", "float64")


def _readers(calls: list[Call], producer: Call, out: int = 0) -> list[Call]:
    return [
        c
        for c in calls[producer.index + 1 :]
        if any(a.source == (producer.index, out) for a in c.args if a.kind == "tensor")
    ]


def _single_next(calls: list[Call], producer: Call, ops: tuple[str, ...]) -> Call | None:
    """The one reader of `producer`'s first output, when it is one of `ops` and nothing else reads it."""
    if not producer.outputs or producer.consumers[0] != 1 or 0 in producer.model_outputs:
        return None
    readers = _readers(calls, producer)
    if len(readers) == 1 and readers[0].op in ops:
        return readers[0]
    return None


def _float_cast(call: Call) -> bool:
    """`aten._to_copy` that only changes a floating dtype (same device, layout kept)."""
    if call.op != "aten._to_copy.default" or not call.outputs or call.outputs[0] is None:
        return False
    src = call.args[0].tensor
    out = call.outputs[0]
    return src is not None and src.dtype in FLOAT_TYPES and out.dtype in FLOAT_TYPES and src.device == out.device


def _scalar(arg: ArgSpec | None) -> float | None:
    if arg is None or arg.kind != "scalar" or isinstance(arg.value, (bool, list)) or arg.value is None:
        return None
    return float(arg.value) if isinstance(arg.value, (int, float)) else None


def _last_dim(arg: ArgSpec | None, ndim: int) -> bool:
    if arg is None or not isinstance(arg.value, list) or len(arg.value) != 1:
        return False
    dim = arg.value[0]
    return isinstance(dim, int) and dim in (-1, ndim - 1)


def rms_norm(calls: list[Call], start: Call) -> list[int] | None:
    """[_to_copy(float)] pow(x, 2) -> mean(-1, keepdim) -> add eps -> rsqrt -> mul(x, r) -> [_to_copy] -> mul(w)
    -> [_to_copy]: the call indices of one rms_norm, or None."""
    chain: list[Call] = []
    first = start
    if _float_cast(start):
        readers = _readers(calls, start)
        pows = [c for c in readers if c.op == "aten.pow.Tensor_Scalar"]
        # the cast x is read twice (x^2 and x * r) and by nothing else
        if len(pows) != 1 or len(readers) != 2 or start.consumers[0] != 2 or 0 in start.model_outputs:
            return None
        chain.append(start)
        first = pows[0]
    if first.op != "aten.pow.Tensor_Scalar" or _scalar(first.arg("args[1]")) != 2.0:
        return None
    xf = first.args[0]
    if xf.tensor is None or not xf.tensor.shape:
        return None
    chain.append(first)
    mean = _single_next(calls, first, ("aten.mean.dim",))
    keep = mean.arg("args[2]") if mean is not None else None
    if (
        mean is None
        or not _last_dim(mean.arg("args[1]"), len(xf.tensor.shape))
        or keep is None
        or keep.value is not True
    ):
        return None
    chain.append(mean)
    add = _single_next(calls, mean, ("aten.add.Scalar", "aten.add_.Scalar", "aten.add.Tensor", "aten.add_.Tensor"))
    alpha = add.arg("kwargs.alpha") if add is not None else None
    if add is None or _scalar(add.arg("args[1]")) is None or (alpha is not None and alpha.value != 1):
        return None
    chain.append(add)
    rsqrt = _single_next(calls, add, ("aten.rsqrt.default",))
    if rsqrt is None:
        return None
    chain.append(rsqrt)
    normed = _single_next(calls, rsqrt, ("aten.mul.Tensor",))
    if normed is None or not any(a.source == xf.source for a in normed.tensor_args() if a.source != (rsqrt.index, 0)):
        return None
    chain.append(normed)
    tail = normed
    cast_mid = _single_next(calls, tail, ("aten._to_copy.default",))
    if cast_mid is not None and _float_cast(cast_mid):
        chain.append(cast_mid)
        tail = cast_mid
    weighted = _single_next(calls, tail, ("aten.mul.Tensor",))
    if weighted is None:
        return None
    other = [a for a in weighted.tensor_args() if a.source != (tail.index, 0)]
    if len(other) != 1 or other[0].tensor is None or other[0].tensor.shape != [xf.tensor.shape[-1]]:
        return None
    chain.append(weighted)
    cast_end = _single_next(calls, weighted, ("aten._to_copy.default",))
    if cast_end is not None and _float_cast(cast_end):
        chain.append(cast_end)
    return [c.index for c in chain]


def silu_mul(calls: list[Call], start: Call) -> list[int] | None:
    """silu(gate) -> mul(that, up) with gate, up and the product of one shape and dtype (SwiGLU): indices, or None."""
    if start.op != "aten.silu.default" or not start.outputs or start.outputs[0] is None:
        return None
    mul = _single_next(calls, start, ("aten.mul.Tensor",))
    if mul is None or not mul.outputs or mul.outputs[0] is None:
        return None
    tensors = mul.tensor_args()
    if len(tensors) != 2 or any(a.tensor is None for a in tensors):
        return None
    out = start.outputs[0]
    if any(a.tensor is not None and (a.tensor.shape != out.shape or a.tensor.dtype != out.dtype) for a in tensors):
        return None
    if mul.outputs[0].shape != out.shape or mul.outputs[0].dtype != out.dtype:
        return None
    return [start.index, mul.index]


PATTERNS = {"rms_norm": rms_norm, "silu_mul": silu_mul}


def find(calls: list[Call]) -> list[tuple[str, list[int]]]:
    """Every non-overlapping pattern instance, earliest first: (pattern name, call indices in order)."""
    taken: set[int] = set()
    found: list[tuple[str, list[int]]] = []
    for call in calls:
        if call.index in taken:
            continue
        for name, match in PATTERNS.items():
            indices = match(calls, call)
            if indices is not None and not taken.intersection(indices):
                found.append((name, sorted(indices)))
                taken.update(indices)
                break
    return found
