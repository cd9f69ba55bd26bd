"""Fused patterns: chains of aten calls that one card kernel replaces.

Why: some operators reach the dispatcher decomposed. `F.rms_norm` on the CPU (and every hand-written Llama RMSNorm:
`x.float().pow(2).mean(-1, keepdim=True)`, `+ eps`, `rsqrt`, two multiplies, casts) is six to eight calls, each a
full pass over the row; SwiGLU's `silu(gate) * up` is two. And a model's neighbouring calls fuse: a residual add
before a norm, a bias add before an activation, a scale and a mask before a softmax, an activation after a group
norm or after an eval batch norm (and its residual add: ResNet's). One kernel for the chain reads the inputs once
and writes the output once, which is where the time is (and what torch.compile's fusion wins). A chain is fused
only when every intermediate is read by the chain's own later calls alone (nothing else in the model, nor its
outputs, sees it), so a runtime that replaces the chain computes everything the model uses; the one exception is a
residual sum, which the chain's kernel then writes beside the norm (the residual stream reads it again:
`kept_sum`). Every call of a chain is also a variant of its own (`calls.group_calls`): eager PyTorch replaces single
calls, only a graph pass replaces a chain.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from kernelforge_tui.capture.calls import Call
from kernelforge_tui.capture.manifest import ArgSpec, TensorMeta

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


NORMS = ("aten.native_layer_norm.default", "aten.rms_norm.default", "aten._fused_rms_norm.default")
ACTIVATIONS = ("aten.gelu.default", "aten.silu.default", "aten.relu.default")
SOFTMAX = "aten._softmax.default"
SCALES = ("aten.mul.Tensor", "aten.div.Tensor")


def _results_unread(call: Call) -> bool:
    """Nothing reads the call's results after the first (a norm's mean and rstd, kept for backward)."""
    return all(call.consumers[k] == 0 and k not in call.model_outputs for k in range(1, len(call.outputs)))


class Add(NamedTuple):
    """A tensor add's operands (args[0], args[1]) and their result, all of one floating dtype."""

    first: ArgSpec
    second: ArgSpec
    a: TensorMeta
    b: TensorMeta
    out: TensorMeta


def tensor_add(call: Call) -> Add | None:
    """The call as a tensor add with alpha 1, or None."""
    alpha = call.arg("kwargs.alpha") or call.arg("args[2]")
    first, second = call.arg("args[0]"), call.arg("args[1]")
    out = call.outputs[0] if call.outputs else None
    if call.op != "aten.add.Tensor" or (alpha is not None and alpha.value != 1) or out is None:
        return None
    if first is None or second is None or first.tensor is None or second.tensor is None:
        return None
    if not first.tensor.dtype == second.tensor.dtype == out.dtype or out.dtype not in FLOAT_TYPES:
        return None
    return Add(first, second, first.tensor, second.tensor, out)


def residual_norm(calls: list[Call], start: Call) -> list[int] | None:
    """add(x, r) of one shape -> layer_norm or rms_norm of the sum over the last axis (one call, or the decomposed
    rms_norm pattern), the norm's other results unread: the call indices, or None. Other calls may read the sum too
    (a transformer's residual stream: x = x + attn, then norm(x) and, later, x + mlp): then the chain's kernel writes
    the sum as well (`kept_sum`), but the model may not return it."""
    add = tensor_add(start)
    if add is None or not add.a.shape == add.b.shape == add.out.shape:
        return None
    readers = _readers(calls, start)
    if not readers:
        return None
    norm = readers[0]
    if norm.op in NORMS:
        chain = [start.index, norm.index] if norm.args[0].source == (start.index, 0) and _results_unread(norm) else []
    else:
        rest = rms_norm(calls, norm) or []
        chain = [start.index, *rest] if rest and calls[rest[0]].args[0].source == (start.index, 0) else []
    return chain if chain and 0 not in start.model_outputs else None


def kept_sum(chain: list[Call]) -> bool:
    """Whether calls outside a residual norm chain read its sum (the chain's first result), so it writes it too."""
    inside = sum(1 for c in chain[1:] for a in c.tensor_args() if a.source == (chain[0].index, 0))
    return chain[0].consumers[0] > inside


def bias_act(calls: list[Call], start: Call) -> list[int] | None:
    """add(x, b) with b along the last axis of x -> gelu, silu or relu of the sum: the call indices, or None."""
    add = tensor_add(start)
    if add is None or len(add.out.shape) < 2:
        return None
    shapes = sorted((add.a.shape, add.b.shape), key=len)
    if shapes != [add.out.shape[-1:], add.out.shape]:
        return None
    act = _single_next(calls, start, ACTIVATIONS)
    if act is None or act.args[0].source != (start.index, 0):
        return None
    return [start.index, act.index]


def _scaling(call: Call) -> bool:
    """x * s or x / s with a Python number s."""
    other = call.arg("args[1]")
    return (
        call.op in SCALES
        and other is not None
        and other.kind == "scalar"
        and isinstance(other.value, (int, float))
        and not isinstance(other.value, bool)
    )


def mask_layout(x: list[int], mask: list[int]) -> tuple[int, int, int] | None:
    """(batch, heads, seq) when `mask` broadcasts over the rows of `x` [..., cols] as [batch, 1, seq, cols] does over
    [batch, heads, seq, cols] (leading dims kept, middle dims of 1, trailing dims kept; any run may be empty), so
    that row r of x reads mask row (r / (heads * seq)) * seq + r % seq, or r % seq where the mask has no batch;
    None for another broadcast."""
    if not x or not mask or len(mask) > len(x) or mask[-1] != x[-1]:
        return None
    padded = [1] * (len(x) - len(mask)) + mask
    lead, rest = x[:-1], padded[:-1]
    k = 0
    while k < len(lead) and rest[k] == lead[k]:
        k += 1
    middle = k
    while middle < len(lead) and rest[middle] == 1:
        middle += 1
    if rest[middle:] != lead[middle:]:
        return None
    return math.prod(lead[:k]), math.prod(lead[k:middle]), math.prod(lead[middle:])


def _masking(call: Call, data: tuple[int, int] | None) -> bool:
    """x + mask with a mask that broadcasts over x's rows (`mask_layout`); `data`: where x must come from."""
    add = tensor_add(call)
    if add is None or (data is not None and add.first.source != data):
        return False
    return add.a.shape == add.out.shape and mask_layout(add.a.shape, add.b.shape) is not None


def _last_axis_softmax(call: Call) -> bool:
    x = call.args[0].tensor if call.args else None
    dim, half = call.arg("args[1]"), call.arg("args[2]")
    return (
        call.op == SOFTMAX
        and x is not None
        and dim is not None
        and dim.value in (-1, len(x.shape) - 1)
        and (half is None or half.value is False)
    )


def scale_mask_softmax(calls: list[Call], start: Call) -> list[int] | None:
    """[x * s or x / s] -> [+ mask] -> [_to_copy to a float] -> softmax over the last axis -> [_to_copy], with the
    scale or the mask (or both): the call indices, or None."""
    chain: list[Call] = []
    current: Call | None = start
    if _scaling(start):
        chain.append(start)
        current = _single_next(calls, start, ("aten.add.Tensor", "aten._to_copy.default", SOFTMAX))
    if current is not None and _masking(current, (chain[-1].index, 0) if chain else None):
        chain.append(current)
        current = _single_next(calls, current, ("aten._to_copy.default", SOFTMAX))
    if not chain:
        return None
    if current is not None and _float_cast(current):
        chain.append(current)
        current = _single_next(calls, current, (SOFTMAX,))
    if current is None or not _last_axis_softmax(current) or current.args[0].source != (chain[-1].index, 0):
        return None
    chain.append(current)
    cast = _single_next(calls, current, ("aten._to_copy.default",))
    if cast is not None and _float_cast(cast):
        chain.append(cast)
    return [c.index for c in chain]


BATCH_NORM = {
    # overload -> (position of training or None, position of eps)
    "aten.native_batch_norm.default": (5, 7),
    "aten._native_batch_norm_legit_no_training.default": (None, 6),
    "aten.cudnn_batch_norm.default": (5, 7),
    "aten.miopen_batch_norm.default": (5, 7),
}
IN_PLACE = {
    "aten.add_.Tensor": "aten.add.Tensor",
    "aten.relu_.default": "aten.relu.default",
    "aten.silu_.default": "aten.silu.default",
}


def functional(op: str) -> str:
    """The out-of-place overload of an in-place one (add_ -> add), else the overload itself."""
    return IN_PLACE.get(op, op)


def _eval_batch_norm(call: Call) -> bool:
    """A batch norm with running statistics (eval mode) whose saved statistics nothing reads."""
    if call.op not in BATCH_NORM or not call.outputs or call.outputs[0] is None:
        return False
    training_at, _ = BATCH_NORM[call.op]
    training = call.arg(f"args[{training_at}]") if training_at is not None else None
    return (training_at is None or (training is not None and training.value is False)) and _results_unread(call)


def _step_of(call: Call, producer: Call, op: str) -> bool:
    """`call` is `op` (or its in-place form) on `producer`'s result, writing in place only into that result (an
    intermediate of the chain, never a tensor from outside it)."""
    if functional(call.op) != op or not call.outputs or call.outputs[0] is None:
        return False
    reads = [a for a in call.tensor_args() if a.source == (producer.index, 0)]
    return bool(reads) and (call.op == op or call.args[0].source == (producer.index, 0))


def batch_norm_act(calls: list[Call], start: Call) -> list[int] | None:
    """batch_norm in eval mode, its saved statistics unread -> [add of a tensor of its shape: a residual] -> relu,
    silu or gelu, the add and the activation in place or not (torchvision's `out += identity`, ReLU(inplace=True)):
    the call indices, or None."""
    if not _eval_batch_norm(start):
        return None
    adds = ("aten.add.Tensor", "aten.add_.Tensor")
    following = _single_next(calls, start, (*adds, *ACTIVATIONS, *IN_PLACE))
    chain = [start]
    if following is not None and _step_of(following, start, "aten.add.Tensor"):
        alpha = following.arg("kwargs.alpha")
        operands = following.tensor_args()
        metas = {(a.tensor.dtype, tuple(a.tensor.shape)) if a.tensor else None for a in operands}
        if len(operands) != 2 or len(metas) != 1 or (alpha is not None and alpha.value != 1):
            return None
        chain.append(following)
        following = _single_next(calls, following, (*ACTIVATIONS, *IN_PLACE))
    act = functional(following.op) if following is not None else ""
    if following is None or act not in ACTIVATIONS or not _step_of(following, chain[-1], act):
        return None
    return [*(c.index for c in chain), following.index]


PRODUCTS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")


def product_act(calls: list[Call], start: Call) -> list[int] | None:
    """mm, addmm or bmm -> gelu, silu or relu of its result (nn.Linear then an activation, on a 2-D input): the call
    indices, or None."""
    if start.op not in PRODUCTS:
        return None
    act = _single_next(calls, start, ACTIVATIONS)
    if act is None or act.args[0].source != (start.index, 0):
        return None
    return [start.index, act.index]


def group_norm_act(calls: list[Call], start: Call) -> list[int] | None:
    """group_norm -> silu, gelu or relu of its result, its mean and rstd unread: the call indices, or None."""
    if start.op != "aten.native_group_norm.default" or not _results_unread(start):
        return None
    act = _single_next(calls, start, ACTIVATIONS)
    if act is None or act.args[0].source != (start.index, 0):
        return None
    return [start.index, act.index]


ACTIVATION_NAMES = {"aten.gelu.default": "gelu", "aten.silu.default": "silu", "aten.relu.default": "relu"}


def chain_name(pattern: str, chain: list[Call]) -> str:
    """The name of one instance of a pattern, as its card is named: residual_layer_norm or residual_rms_norm
    (residual_sum_layer_norm, residual_sum_rms_norm where others read the sum too: `kept_sum`), bias_gelu
    (bias_gelu_tanh, bias_silu, bias_relu), addmm_gelu (mm_ and bmm_, each with every activation), scale_softmax,
    mask_softmax or scale_mask_softmax, group_norm_silu (_gelu, _relu), batch_norm_relu or batch_norm_add_relu (every
    activation); rms_norm and silu_mul as they are."""
    last = chain[-1]
    if pattern == "residual_norm":
        norm = "layer_norm" if chain[1].op == NORMS[0] else "rms_norm"
        return f"residual_sum_{norm}" if kept_sum(chain) else f"residual_{norm}"
    if pattern in ("bias_act", "group_norm_act", "product_act", "batch_norm_act"):
        approximate = last.arg("kwargs.approximate") or last.arg("args[1]")
        tanh = approximate is not None and approximate.value == "tanh"
        act = ACTIVATION_NAMES[functional(last.op)] + ("_tanh" if tanh else "")
        first = chain[0].op.split(".")[1] if pattern == "product_act" else pattern.removesuffix("_act")
        first += "_add" if pattern == "batch_norm_act" and len(chain) == 3 else ""
        return f"{first}_{act}"
    if pattern == "scale_mask_softmax":
        scaled, masked = _scaling(chain[0]), any(c.op == "aten.add.Tensor" for c in chain)
        return "scale_mask_softmax" if scaled and masked else "scale_softmax" if scaled else "mask_softmax"
    return pattern


PATTERNS = {
    "residual_norm": residual_norm,
    "bias_act": bias_act,
    "scale_mask_softmax": scale_mask_softmax,
    "group_norm_act": group_norm_act,
    "batch_norm_act": batch_norm_act,
    "product_act": product_act,
    "rms_norm": rms_norm,
    "silu_mul": silu_mul,
}
"""Tried in this order at each call: a chain that starts earlier in the forward pass wins, and at one call the
longer chain (a residual add before a decomposed rms_norm) wins over the pattern inside it."""


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
                found.append((chain_name(name, [calls[i] for i in sorted(indices)]), sorted(indices)))
                taken.update(indices)
                break
    return found
