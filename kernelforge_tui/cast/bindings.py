"""Which aten call a card's kernel can stand in for, and how the call's arguments map onto the card's tensors.

Two sources:
- a captured variant (`capture.json`): the overload, every argument as the model passed it, and where each card
  tensor sits in the call (`Variant.bindings`). A single aten call (`replaceable`) is overridden in eager and in
  compiled graphs; a fused chain (a pattern variant, its card's [chain]) becomes a chain guard, which only the
  compile path matches (`cast.fused`). The guard takes the captured shapes, strides, dtypes, alignment and scalar
  values exactly;
- a hand-written card (a run of `examples/cards/...`): a small built-in table by family and tensor layout (a
  softmax card is `aten::_softmax.default(x, dim=-1, half_to_float=False) -> y`). A card the table does not
  know gets no kernel, and the audit says so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kernelforge_tui.cards.chain import ChainArg
from kernelforge_tui.cards.model import OperatorCard, contiguous_strides
from kernelforge_tui.cast.manifest import (
    DEFAULT_ALIGNMENT,
    AtenArg,
    Chain,
    ChainStep,
    Scalar,
    TensorGuard,
    describe_call,
)

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
    chain: Chain | None = None
    """A fused chain's calls: its kernel replaces them in compiled graphs only."""


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


CHAIN_NAMESPACE = "kernelforge"
"""A chain guard's overload is `kernelforge::<pattern>`: no aten operator, the kernel op's own name."""


def _place(path: str) -> tuple[str, int | None] | str:
    """(schema name, position) of an argument path (`args[3]`: arg3, 3; `kwargs.eps`: eps, None), or why not."""
    found = _ARG_PATH.match(path)
    if found is None:
        return f"argument {path} is nested (a tensor inside a list): the runtime checks top-level arguments only"
    position = int(found.group(1)) if found.group(1) is not None else None
    return found.group(2) or f"arg{position}", position


def _input_guard(spec: OperatorCard, binding: object, meta: object) -> TensorGuard | str:
    """The guard of a card input the capture bound (`capture.manifest.Binding`) to a tensor the call passed
    (`capture.manifest.TensorMeta`), or why the runtime cannot take it."""
    from kernelforge_tui.capture.manifest import Binding, TensorMeta

    assert isinstance(binding, Binding) and isinstance(meta, TensorMeta)
    if not meta.contiguous and not binding.order:  # an order: the card holds the tensor as it lies in memory
        return f"tensor argument {binding.path} was not contiguous when captured (stride {meta.stride})"
    dtype = spec.tensor(binding.tensor).dtype
    if dtype != meta.dtype:
        return f"the card's {binding.tensor} is {dtype}, the call passed {meta.dtype}"
    view = card_view(spec, binding.tensor, meta.shape, binding)
    if isinstance(view, str):
        return view
    return TensorGuard(
        name=binding.tensor,
        shape=tuple(meta.shape),
        dtype=meta.dtype,
        strides=tuple(meta.stride),
        alignment=meta.alignment if 0 < meta.alignment <= DEFAULT_ALIGNMENT else DEFAULT_ALIGNMENT,
        card_shape=view if view != tuple(meta.shape) else None,
    )


def _output_guard(spec: OperatorCard, op: str, index: int, binding: object, meta: object) -> TensorGuard | str:
    """The guard of a card output the capture bound to result `index` of the call `op`, or why not."""
    from kernelforge_tui.capture.manifest import Binding, TensorMeta

    if not isinstance(meta, TensorMeta):
        return f"{op} returns a non-tensor result (out[{index}])"
    assert isinstance(binding, Binding)
    if not meta.contiguous and not binding.order:
        return (
            f"{op} returned out[{index}] with strides {meta.stride}; the runtime returns its outputs row-major "
            "contiguous, or as the card lays them out in memory"
        )
    if spec.tensor(binding.tensor).dtype != meta.dtype:
        return f"the card's {binding.tensor} is {spec.tensor(binding.tensor).dtype}, the call returned {meta.dtype}"
    view = card_view(spec, binding.tensor, meta.shape, binding)
    if isinstance(view, str):
        return view
    return TensorGuard(
        name=binding.tensor,
        shape=tuple(meta.shape),
        dtype=meta.dtype,
        strides=tuple(meta.stride) if binding.order else contiguous_strides(tuple(meta.shape)),
        card_shape=view if view != tuple(meta.shape) else None,
    )


def _scalar_arg(name: str, position: int | None, kind: str, value: object, path: str) -> AtenArg | str:
    """A scalar argument as the guard compares it: dtype, device, layout and memory format by torch's name, a
    non-finite float as the float, None as None; or why it is not plain data."""
    if kind == "none":
        return AtenArg(name=name, position=position, accepts=[None])
    if kind == "float" and value in ("inf", "-inf"):
        return AtenArg(name=name, position=position, accepts=[float(str(value))])
    plain = _scalar(value)
    if kind in ("scalar", "dtype", "device", "layout", "memory_format") and plain is not None:
        return AtenArg(name=name, position=position, accepts=[plain])
    return f"argument {path} ({value!r}) is not plain data the guard can compare"


def from_variant(variant: object, spec: OperatorCard) -> CallBinding | str:
    """The binding of a captured variant (`capture.manifest.Variant`), or why the runtime cannot take it."""
    from kernelforge_tui.capture.manifest import Variant

    assert isinstance(variant, Variant)
    if variant.kind == "pattern":
        return _chain_binding(variant, spec)
    if len(variant.steps) != 1:
        return f"a variant of {len(variant.steps)} calls ({variant.op}): the runtime overrides single aten calls"
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
        place = _place(arg.path)
        if isinstance(place, str):
            return place
        name, position = place
        if arg.kind == "tensor":
            binding = by_path.get(arg.path)
            if arg.tensor is None or binding is None:
                return f"tensor argument {arg.path} is not one of the card's inputs"
            guard = _input_guard(spec, binding, arg.tensor)
            if isinstance(guard, str):
                return guard
            inputs.append(guard)
            args.append(AtenArg(name=name, position=position, tensor=binding.tensor))
            continue
        made = _scalar_arg(name, position, arg.kind, arg.value, arg.path)
        if isinstance(made, str):
            return made
        args.append(made)
    outputs: list[TensorGuard] = []
    carded: list[tuple[int, int]] = []
    by_output = {b.path: b for b in variant.bindings if b.role == "output" and b.step == 0}
    for index, meta in enumerate(step.outputs):
        binding = by_output.get(f"out[{index}]")
        if binding is None:
            continue  # a result the card does not compute (attention's logsumexp): see below
        out = _output_guard(spec, step.op, index, binding, meta)
        if isinstance(out, str):
            return out
        outputs.append(out)
        carded.append((0, index))
    if not inputs or not outputs:
        return "the call has no tensor input or no tensor output"
    if len(carded) < len(step.outputs):
        # An eager override must return every result; a graph can do without those nothing reads: the call
        # becomes a chain of one, whose outputs are the card's, and only the compile path replaces it.
        name = overload.partition("::")[2].partition(".")[0].lstrip("_")
        chain = Chain(
            pattern=f"{name}_{'_'.join(str(i) for _, i in carded)}",
            steps=[ChainStep(overload=overload, args=args, results=len(step.outputs))],
            outputs=carded,
        )
        return _chain_call(chain, inputs, outputs)
    return CallBinding(overload, args, inputs, outputs, describe(overload, inputs))


def _chain_arg(arg: ChainArg) -> AtenArg | str:
    place = _place(arg.path)
    if isinstance(place, str):
        return place
    name, position = place
    if arg.kind == "input":
        return AtenArg(name=name, position=position, tensor=arg.input)
    if arg.kind == "step":
        assert arg.step is not None
        return AtenArg(name=name, position=position, link=(arg.step, arg.out))
    return _scalar_arg(name, position, arg.kind, arg.value, arg.path)


def _chain_binding(variant: object, spec: OperatorCard) -> CallBinding | str:
    """A fused chain's guard: the card inputs and outputs as the captured calls saw them, and every call with its
    wiring from the card's [chain]; its kernel replaces the calls in compiled graphs only."""
    from kernelforge_tui.capture.manifest import Variant

    assert isinstance(variant, Variant)
    chain = spec.chain
    if chain is None or len(chain.steps) != len(variant.steps):
        return f"a fused pattern ({variant.op}) whose card has no [chain] of its calls: capture the model again"
    inputs: list[TensorGuard] = []
    outputs: list[TensorGuard] = []
    for binding in variant.bindings:
        step = variant.steps[binding.step]
        if binding.role == "input":
            meta = next((a.tensor for a in step.args if a.path == binding.path), None)
            guard = _input_guard(spec, binding, meta) if meta is not None else f"no tensor at {binding.path}"
        else:
            index = int(binding.path.removeprefix("out[").rstrip("]"))
            guard = _output_guard(spec, step.op, index, binding, step.outputs[index])
        if isinstance(guard, str):
            return guard
        (inputs if binding.role == "input" else outputs).append(guard)
    steps: list[ChainStep] = []
    for made in chain.steps:
        args = [_chain_arg(a) for a in made.args]
        problem = next((a for a in args if isinstance(a, str)), None)
        if problem is not None:
            return problem
        typed = [a for a in args if isinstance(a, AtenArg)]
        steps.append(ChainStep(overload=normalize_overload(made.op), args=typed, results=made.results))
    guard_chain = Chain(pattern=chain.pattern, steps=steps, outputs=[chain.outputs[t.name] for t in outputs])
    return _chain_call(guard_chain, inputs, outputs)


def _chain_call(chain: Chain, inputs: list[TensorGuard], outputs: list[TensorGuard]) -> CallBinding:
    """A chain guard's binding: its kernel op `kernelforge::<pattern>` takes the card inputs in order."""
    overload = f"{CHAIN_NAMESPACE}::{chain.pattern}"
    kernel_args = [AtenArg(name=t.name, position=k, tensor=t.name) for k, t in enumerate(inputs)]
    words = f"{describe(overload, inputs)}: {chain.describe()}"
    return CallBinding(overload, kernel_args, inputs, outputs, words, chain=chain)
