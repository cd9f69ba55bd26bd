"""The reference a captured card carries: `reference.py`, which re-runs the captured aten call(s) with torch.

Why torch and not NumPy: the reference must be the operator the model runs (its eps, its dtype rules, how it treats
NaN and inf), and the surest way is to call that very overload again, with the captured scalar arguments, on the
card's inputs reshaped to the captured shapes. It computes in float64 on the CPU where the op allows (floating
inputs and dtype arguments raised to float64, `half_to_float` off), like the built-in NumPy references, and in the
captured dtypes otherwise. An elementwise op computes first in its opmath, float32 for bf16, fp16 and fp32 data, as
PyTorch's kernels do: it accumulates nothing, so float64 buys no accuracy there, and it would disagree with the
operator where float32 itself overflows (silu's exp(-x) past x = -88 is inf, so silu is 0 in float32 and a tiny
number in float64, which a large `up` then makes visible); only where float32 went NaN or inf inside the op and
float64's result, rounded to float32, is another value does it take float64's (which intermediate overflows first
is one CPU's vector path, not the operator). A fused chain of calls computes first stepwise: each call in float64
(an elementwise chain in its opmath), each intermediate result rounded to the dtype the call returned (through
float32, as the call's opmath rounds it) and each float scalar to float32 (as the call takes it), as eager computes
and stores them: a residual add before a norm rounds the sum to the tensors' dtype, and a fused kernel must too.
`kernelforge capture` checks each against the eager outputs it stored and keeps the first that agrees. The file is
self-contained (the graph is data inside it; it imports only NumPy and torch), so the card stays a directory a person
can read, and needs torch wherever the card's fresh and stress sets are referenced: a machine without torch gets an
error saying how to install it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from kernelforge_tui.capture.manifest import ArgSpec, Binding, Step

Encoded = dict[str, object] | None
SOFTMAX_LIKE = ("aten._softmax.default", "aten._log_softmax.default")
REPLAY_AS = {
    "aten.cudnn_batch_norm.default": "aten.native_batch_norm.default",
    "aten.miopen_batch_norm.default": "aten.native_batch_norm.default",
}
"""Overloads with only a GPU kernel, re-run on the CPU as the overload that takes the same arguments in the same
order and computes the same first result (cuDNN's batch norm returns one more output, its reserve space)."""


class NotReplayable(ValueError):
    """A captured call the reference cannot re-run (a tensor that is neither a card input nor an earlier result)."""


def _encode(arg: ArgSpec, inputs: dict[tuple[int, str], str], step: int, op: str) -> Encoded:
    if arg.kind == "none":
        return None
    if arg.kind == "tensor":
        if arg.source is not None:
            return {"step": arg.source[0], "out": arg.source[1]}
        name = inputs.get((step, arg.path))
        if name is None:
            raise NotReplayable(f"step {step} ({op}) {arg.path}: a tensor that is not a card input")
        return {"input": name}
    if arg.kind == "scalar":
        encoded: dict[str, object] = {"value": arg.value}
        if op in SOFTMAX_LIKE and arg.path == "args[2]":
            encoded["value64"] = False  # half_to_float: off once every tensor is float64
        return encoded
    if arg.kind == "float":
        return {"float": arg.value}
    if arg.kind in ("dtype", "device", "layout", "memory_format"):
        return {arg.kind: arg.value}
    raise NotReplayable(f"step {step} ({op}) {arg.path}: a {arg.kind} argument ({arg.value!r}) cannot be re-run")


def graph(
    steps: list[Step], bindings: list[Binding], places: Mapping[tuple[int, str], str] | None = None
) -> dict[str, object]:
    """The replay graph: each step's overload and arguments, the card inputs bound into them (at `places`, (step,
    path) -> input, where an input is read in more places than its binding's), the outputs read."""
    inputs = dict(places) if places is not None else {(b.step, b.path): b.tensor for b in bindings if b.role == "input"}
    encoded_steps = []
    for k, step in enumerate(steps):
        args: list[Encoded] = []
        kwargs: dict[str, Encoded] = {}
        lists: dict[str, list[Encoded]] = {}
        for arg in step.args:
            if arg.kind == "list":
                lists[arg.path] = []
                continue
            parent = arg.path.rsplit("[", 1)[0] if arg.path.count("[") == 2 else None
            value = _encode(arg, inputs, k, step.op)
            if parent is not None and parent in lists:
                lists[parent].append(value)
            elif arg.path.startswith("kwargs."):
                kwargs[arg.path.removeprefix("kwargs.")] = value
            else:
                args.append(value)
        for path, items in lists.items():
            position = int(path.removeprefix("args[").rstrip("]"))
            args.insert(position, {"list": items})
        encoded_steps.append({"op": REPLAY_AS.get(step.op, step.op), "args": args, "kwargs": kwargs})
    return {
        "steps": encoded_steps,
        "dtypes": [[None if m is None else m.dtype for m in step.outputs] for step in steps],
        "inputs": {b.tensor: b.op_shape for b in bindings if b.role == "input"},
        "orders": {b.tensor: b.order for b in bindings if b.order},
        "outputs": {
            b.tensor: [b.step, int(b.path.removeprefix("out[").rstrip("]"))] for b in bindings if b.role == "output"
        },
    }


TEMPLATE = '''"""Reference of card {name}, written by `kernelforge capture` (capture the model again to change it).

Re-runs the captured aten call(s) with torch on the CPU, on the card's inputs reshaped to the captured shapes:
{calls}
Precision: {precision} ("float64": floating tensors and dtype arguments raised to float64, as the built-in NumPy
references compute; "opmath": raised to float32, as the operator computes; "captured": the captured dtypes;
"stepwise" and "stepwise-opmath": float64 and opmath with each call's result rounded to the dtype it returned before a
later call reads it, and float scalars to float32, as eager computes and stores them). Needs torch (pip install
'kernelforge-tui[torch]').
"""

from __future__ import annotations

import json

import numpy as np

PRECISION = "{precision}"
STEPWISE = PRECISION.startswith("stepwise")
BASE = {{"stepwise": "float64", "stepwise-opmath": "opmath"}}.get(PRECISION, PRECISION)
"""What each call computes in."""
RAISED = {{
    "float64": lambda torch, dtype: torch.float64,
    "opmath": lambda torch, dtype: torch.float64 if dtype == torch.float64 else torch.float32,
}}
"""What a floating dtype argument becomes in each raised precision."""
GRAPH = json.loads(
    r"""
{graph}
"""
)


def _torch():
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            "this card was captured from PyTorch and its reference re-runs the captured aten call with torch: "
            "install it (pip install 'kernelforge-tui[torch]')"
        ) from None
    return torch


def _tensor(torch, array, shape, precision):
    array = np.ascontiguousarray(array)
    floating = array.dtype.kind == "f" or array.dtype.name == "bfloat16"
    if floating and precision == "opmath":
        tensor = torch.from_numpy(array.astype(np.float64 if array.dtype == np.float64 else np.float32))
    elif array.dtype.name == "bfloat16":
        wide = torch.from_numpy(array.astype(np.float64 if precision == "float64" else np.float32))
        tensor = wide if precision == "float64" else wide.to(torch.bfloat16)
    elif array.dtype.kind == "f" and precision == "float64":
        tensor = torch.from_numpy(array.astype(np.float64))
    else:
        tensor = torch.from_numpy(array)
    return tensor.reshape(shape)


def _input(torch, name, array, shape, precision):
    """A card input as the op saw it: reshaped, or, where the op's tensor was not row-major (GRAPH["orders"]: its
    dims in memory order, a transposed view, channels-last), the card's array (its memory) permuted back into the
    op's dims, with the captured strides."""
    order = GRAPH["orders"].get(name)
    if order is None:
        return _tensor(torch, array, shape, precision)
    back = sorted(range(len(order)), key=order.__getitem__)
    return _tensor(torch, array, [shape[d] for d in order], precision).permute(back)


def _stored(torch, result, dtype):
    """Stepwise, a call's result as the captured call stored it: rounded through float32 (its opmath) to the dtype it
    returned, and widened again; else as it is."""
    if not STEPWISE or dtype in (None, "float64") or not result.is_floating_point():
        return result
    return result.to(torch.float32).to(getattr(torch, dtype)).to(result.dtype)


def _value(torch, spec, inputs, results, precision):
    if spec is None:
        return None
    if "input" in spec:
        return inputs[spec["input"]]
    if "step" in spec:
        return _stored(torch, results[spec["step"]][spec["out"]], GRAPH["dtypes"][spec["step"]][spec["out"]])
    if "value" in spec:
        value = spec["value64"] if precision == "float64" and "value64" in spec else spec["value"]
        return float(np.float32(value)) if STEPWISE and isinstance(value, float) else value
    if "float" in spec:
        return float(spec["float"])
    if "dtype" in spec:
        dtype = getattr(torch, spec["dtype"])
        if dtype.is_floating_point and precision in RAISED:
            return RAISED[precision](torch, dtype)
        return dtype
    if "device" in spec:
        return torch.device("cpu")
    if "layout" in spec:
        return getattr(torch, spec["layout"])
    if "memory_format" in spec:
        return getattr(torch, spec["memory_format"])
    if "list" in spec:
        return [_value(torch, item, inputs, results, precision) for item in spec["list"]]
    raise ValueError(f"unknown argument {{spec!r}}")


def _op(torch, name):
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def _run(torch, inputs, precision):
    tensors = {{name: _input(torch, name, inputs[name], shape, precision) for name, shape in GRAPH["inputs"].items()}}
    results = []
    with torch.no_grad():
        for step in GRAPH["steps"]:
            args = [_value(torch, a, tensors, results, precision) for a in step["args"]]
            kwargs = {{k: _value(torch, v, tensors, results, precision) for k, v in step["kwargs"].items()}}
            out = _op(torch, step["op"])(*args, **kwargs)
            results.append(list(out) if isinstance(out, (tuple, list)) else [out])
    outputs = {{}}
    for name, (step, index) in GRAPH["outputs"].items():
        out = results[step][index]
        out = out.permute(GRAPH["orders"][name]) if name in GRAPH["orders"] else out  # as the op laid it out
        outputs[name] = (out.double() if out.is_floating_point() else out).contiguous().numpy()
    return outputs


def reference(inputs, sizes):
    """The outputs in PRECISION. In opmath, an element that float32 made NaN or inf inside the op, where float64's
    result rounded to float32 is another value, takes float64's: which intermediate overflows first differs between
    implementations (on the H200 host torch's AVX-512 gelu gives NaN at +inf and inf at 3.3e38, its scalar path and
    CUDA's give inf and 3.3e38), and the kernel is held to the operator's value, not to one CPU's overflow."""
    torch = _torch()
    outputs = _run(torch, inputs, BASE)
    if BASE != "opmath" or all(np.isfinite(out).all() for out in outputs.values()):
        return outputs
    exact = _run(torch, inputs, "float64")
    for name, out in outputs.items():
        with np.errstate(over="ignore"):
            rounded = exact[name].astype(np.float32)
        same = (out == rounded) | (np.isnan(out) & np.isnan(rounded))
        differs = ~np.isfinite(out) & ~same
        out[differs] = np.where(np.isfinite(rounded), exact[name], rounded)[differs]
    return outputs
'''


def source(
    name: str,
    steps: list[Step],
    bindings: list[Binding],
    precision: str,
    places: Mapping[tuple[int, str], str] | None = None,
) -> str:
    """The text of the card's reference.py (`places`: as `graph` takes them)."""
    calls = "".join(
        f"  {k}. {step.op}" + (f" (re-run as {REPLAY_AS[step.op]})" if step.op in REPLAY_AS else "") + "\n"
        for k, step in enumerate(steps)
    )
    text = json.dumps(graph(steps, bindings, places), indent=1)
    return TEMPLATE.format(name=name, calls=calls, precision=precision, graph=text)
