"""Which aten call a card's kernel can stand in for, and how the call's arguments map onto the card's tensors.

Two sources:
- a captured variant (`capture.json`): the overload, every argument as the model passed it, and where each card
  tensor sits in the call (`Variant.bindings`). Only single aten calls (`replaceable`) can be overridden; the
  guard takes the captured shapes, strides, dtypes, alignment and scalar values exactly;
- a hand-written card (a run of `examples/cards/...`): a small built-in table by family and tensor layout (a
  softmax card is `aten::_softmax.default(x, dim=-1, half_to_float=False) -> y`). A card the table does not
  know gets no kernel, and the audit says so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cast.manifest import DEFAULT_ALIGNMENT, AtenArg, Scalar, TensorGuard, describe_call

_ARG_PATH = re.compile(r"^(?:args\[(\d+)\]|kwargs\.([A-Za-z_][A-Za-z0-9_]*))$")
_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class CallBinding:
    """An aten call a card's kernel can run: its overload, arguments, and tensors as the call sees them."""

    overload: str
    """`aten::NAME.OVERLOAD`."""
    args: list[AtenArg]
    inputs: list[TensorGuard]
    outputs: list[TensorGuard]
    call: str
    """The call in words (for the audit)."""


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def normalize_overload(op: str) -> str:
    """`aten._softmax.default` (torch's str of an OpOverload) or `aten::_softmax.default` -> `aten::_softmax.default`;
    a missing overload is `default`."""
    if "::" in op:
        namespace, _, rest = op.partition("::")
    else:
        namespace, _, rest = op.partition(".")
    name, _, which = rest.partition(".")
    return f"{namespace}::{name}.{which or 'default'}"


def _card_tensor(spec: OperatorCard, name: str, alignment: int = DEFAULT_ALIGNMENT) -> TensorGuard:
    tensor = spec.tensor(name)
    shape = tensor.dims(spec.sizes)
    return TensorGuard(
        name=name, shape=shape, dtype=tensor.dtype, strides=contiguous_strides(shape), alignment=alignment
    )


def describe(overload: str, inputs: list[TensorGuard]) -> str:
    return describe_call(overload, inputs)


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def card_view(spec: OperatorCard, name: str, op_shape: Sequence[int], binding: object) -> tuple[int, ...] | str:
    """The card's shape of tensor `name`, checked against the capture's binding (`capture.manifest.Binding`) and the
    call's shape: the same elements in the same row-major order, so the kernel may read the call's contiguous tensor
    as it is. Why not, in words, when they disagree."""
    from kernelforge_tui.capture.manifest import Binding

    assert isinstance(binding, Binding)
    card_shape = spec.tensor(name).dims(spec.sizes)
    if list(op_shape) != binding.op_shape:
        return f"the capture binds {name} to shape {binding.op_shape}, the call had {list(op_shape)}"
    if list(card_shape) != binding.card_shape:
        return f"the card's {name} is {list(card_shape)}, the capture bound it as {binding.card_shape}"
    if _numel(card_shape) != _numel(op_shape):
        return f"the card's {name} {list(card_shape)} does not hold the call's {list(op_shape)} element for element"
    return tuple(card_shape)


# -- hand-written cards ------------------------------------------------------------------------------------------


def from_card(spec: OperatorCard) -> CallBinding | str:
    """The built-in binding for a card, or why there is none."""
    ins, outs = spec.inputs, spec.outputs
    if spec.family == "softmax" and len(ins) == 1 and len(outs) == 1:
        x, y = _card_tensor(spec, ins[0].name), _card_tensor(spec, outs[0].name)
        if x.shape != y.shape or x.dtype != y.dtype:
            return "a softmax card whose output differs from its input in shape or dtype has no aten twin here"
        last = len(x.shape) - 1
        args = [
            AtenArg(name="self", position=0, tensor=x.name),
            AtenArg(name="dim", position=1, accepts=[-1, last] if last != -1 else [-1]),
            AtenArg(name="half_to_float", position=2, accepts=[False]),
        ]
        overload = "aten::_softmax.default"
        return CallBinding(overload, args, [x], [y], describe(overload, [x]))
    if spec.family == "elementwise" and spec.reference.function == "vector_add" and len(ins) == 2 and len(outs) == 1:
        a, b = (_card_tensor(spec, t.name) for t in ins)
        c = _card_tensor(spec, outs[0].name)
        if not a.shape == b.shape == c.shape or not a.dtype == b.dtype == c.dtype:
            return "an add card with broadcasting or mixed dtypes has no aten twin here"
        args = [
            AtenArg(name="self", position=0, tensor=a.name),
            AtenArg(name="other", position=1, tensor=b.name),
            AtenArg(name="alpha", position=None, accepts=[1], default=1, has_default=True),
        ]
        overload = "aten::add.Tensor"
        return CallBinding(overload, args, [a, b], [c], describe(overload, [a, b]))
    return (
        f"no aten call is known for a hand-written {spec.family} card with inputs "
        f"{[t.name for t in ins]} and outputs {[t.name for t in outs]}: export it from a capture "
        "(`kernelforge capture`), whose manifest names the call"
    )


# -- captured variants -------------------------------------------------------------------------------------------


def _scalar(value: object) -> Scalar | None:
    """A captured scalar as the guard stores it (None when it is not plain data)."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list) and all(isinstance(v, _PLAIN) for v in value):
        return list(value)
    return None


def from_variant(variant: object, spec: OperatorCard) -> CallBinding | str:
    """The binding of a captured variant (`capture.manifest.Variant`), or why the runtime cannot override it."""
    from kernelforge_tui.capture.manifest import Variant

    assert isinstance(variant, Variant)
    if variant.kind != "op" or len(variant.steps) != 1:
        return f"a fused pattern of {len(variant.steps)} calls ({variant.op}): the runtime overrides single aten calls"
    if not variant.replaceable:
        return "the capture marks it not replaceable by a single override" + (
            f" ({variant.reason})" if variant.reason else ""
        )
    step = variant.steps[0]
    if step.inplace or step.view:
        what = "in-place" if step.inplace else "a view"
        return f"{step.op} is {what}: the runtime replaces only calls that return new tensors"
    overload = normalize_overload(step.op)
    by_path = {b.path: b for b in variant.bindings if b.role == "input" and b.step == 0}
    inputs: list[TensorGuard] = []
    args: list[AtenArg] = []
    for arg in step.args:
        found = _ARG_PATH.match(arg.path)
        if found is None:
            return (
                f"argument {arg.path} is nested (a tensor inside a list): the runtime checks top-level arguments only"
            )
        position = int(found.group(1)) if found.group(1) is not None else None
        name = found.group(2) or f"arg{position}"
        if arg.kind == "tensor":
            meta, binding = arg.tensor, by_path.get(arg.path)
            if meta is None or binding is None:
                return f"tensor argument {arg.path} is not one of the card's inputs"
            if not meta.contiguous:
                return f"tensor argument {arg.path} was not contiguous when captured (stride {meta.stride})"
            alignment = meta.alignment if 0 < meta.alignment <= DEFAULT_ALIGNMENT else DEFAULT_ALIGNMENT
            dtype = spec.tensor(binding.tensor).dtype
            if dtype != meta.dtype:
                return f"the card's {binding.tensor} is {dtype}, the call passed {meta.dtype}"
            view = card_view(spec, binding.tensor, meta.shape, binding)
            if isinstance(view, str):
                return view
            guard = TensorGuard(
                name=binding.tensor,
                shape=tuple(meta.shape),
                dtype=meta.dtype,
                strides=tuple(meta.stride),
                alignment=alignment,
                card_shape=view if view != tuple(meta.shape) else None,
            )
            inputs.append(guard)
            args.append(AtenArg(name=name, position=position, tensor=binding.tensor))
        elif arg.kind in ("scalar", "none", "dtype", "device", "layout", "memory_format"):
            # dtype, device, layout, memory format: by torch's name, as the runtime compares them
            value = _scalar(arg.value)
            if value is None and arg.kind != "none":
                return f"argument {arg.path} = {arg.value!r} is not plain data the guard can compare"
            args.append(AtenArg(name=name, position=position, accepts=[value]))
        elif arg.kind == "float" and arg.value in ("inf", "-inf"):
            args.append(AtenArg(name=name, position=position, accepts=[float(str(arg.value))]))
        else:
            return f"argument {arg.path} ({arg.value!r}) is not plain data the guard can compare"
    outputs: list[TensorGuard] = []
    by_output = {b.path: b for b in variant.bindings if b.role == "output" and b.step == 0}
    for index, meta in enumerate(step.outputs):
        if meta is None:
            return f"{step.op} returns a non-tensor result (out[{index}])"
        binding = by_output.get(f"out[{index}]")
        if binding is None:
            return f"{step.op} also returns out[{index}] {meta.shape}, which the card does not compute"
        if not meta.contiguous:
            return (
                f"{step.op} returned out[{index}] with strides {meta.stride}; the runtime returns its outputs "
                "row-major contiguous"
            )
        if spec.tensor(binding.tensor).dtype != meta.dtype:
            return f"the card's {binding.tensor} is {spec.tensor(binding.tensor).dtype}, the call returned {meta.dtype}"
        view = card_view(spec, binding.tensor, meta.shape, binding)
        if isinstance(view, str):
            return view
        outputs.append(
            TensorGuard(
                name=binding.tensor,
                shape=tuple(meta.shape),
                dtype=meta.dtype,
                strides=contiguous_strides(tuple(meta.shape)),
                card_shape=view if view != tuple(meta.shape) else None,
            )
        )
    if not inputs or not outputs:
        return "the call has no tensor input or no tensor output"
    return CallBinding(overload, args, inputs, outputs, describe(overload, inputs))
