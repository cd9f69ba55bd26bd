"""Which captured variants become cards, as which family, and why the others do not.

A variant becomes a card when one kernel with the card's row-major tensors can stand in for its call(s): every
tensor it reads and every output the model uses is contiguous, of one floating dtype a baseline exists for, and
the family's layout fits (softmax over the last axis, rms/layer norm over the last axis with a weight, group norm
over NCHW, pooling of NCHW planes to 1x1, elementwise maps of operands of one shape, batch norm with running
statistics). Tensor and size names follow the template library's conventions (x/w/b -> y, rows/cols, n/c/h/w/groups,
gate/up), so its proposer can serve the card. Everything else is listed with the reason, in words a user can act on.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kernelforge_tui.capture import baselines, patterns
from kernelforge_tui.capture.calls import Group
from kernelforge_tui.capture.manifest import ArgSpec, Binding, Json, Step, TensorMeta
from kernelforge_tui.cards.chain import Chain, ChainArg, ChainStep, ChainValue
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import LaunchPlan, OpFamily, Tolerance

TEMPLATE_EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5, "group_norm": 1e-5}
"""The eps the template library's kernels are written with (proposers/templates/row_reductions.py EPS, group_norm.py): a
card with another eps gets correct baselines, but template kernels would fail it, so the offline search skips it."""
FINFO_EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
"""torch.finfo(dtype).eps: what rms_norm uses when it is given eps=None."""

UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
"""The largest relative error of rounding to a 16-bit dtype (half its ulp relative to the value)."""

ELEMENTWISE_FLOPS = {"add": 1, "sub": 1, "mul": 1, "relu": 1, "silu": 4, "silu_mul": 5, "gelu": 8, "gelu_tanh": 10}
MATMUL_OPS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten.matmul.", "aten.linear.")
CONV_OPS = ("aten.convolution.", "aten.cudnn_convolution", "aten._convolution.", "aten.conv")
ALLOCATIONS = ("aten.empty.", "aten.empty_strided.", "aten.empty_like.", "aten.lift_fresh.")
RESHAPES = ("aten._unsafe_view.", "aten._reshape_alias.")


@dataclass(frozen=True)
class PlannedTensor:
    """A card tensor: where it lives in the captured call(s) and its shape over the card's sizes."""

    name: str
    role: Literal["input", "output"]
    step: int
    path: str
    meta: TensorMeta
    dims: list[str | int]
    reads: tuple[tuple[int, str], ...] = ()
    """An input's other places in the calls, (step, path), where they read the same tensor again (an fp32 rms_norm's
    x, read by its square and by its product with the rsqrt)."""
    order: tuple[int, ...] = ()
    """The call's dims in the order they lie in memory, outermost first, where that is not row-major (a matrix
    product's transposed operand, nn.Linear's weight: [..., n - 1, n - 2]; a channels-last NCHW tensor: (0, 2, 3, 1)):
    the card holds the tensor as it lies in memory (`dims` in that order), so nothing is copied to make it
    row-major (`memory_order`)."""


@dataclass(frozen=True)
class RoundedStatistics:
    """An eager kernel that rounds its per-group statistics to the tensors' dtype before it normalises with them.

    CUDA's group norm does (aten/src/ATen/native/cuda/group_norm_kernel.cu): its mean and rstd outputs have x's
    dtype, `RowwiseMomentsCUDAKernel` stores them there, and y = a * x + b is then computed in fp32 from a = rstd *
    gamma and b = beta - a * mean read back from those bf16 (fp16) values. With mean and rstd each off by a relative
    `unit` at most, eager's y departs from the exact math by up to unit * |y - beta| + unit * (1 + unit) * |gamma| *
    |mean| * rstd, before y itself is rounded: relative to y wherever beta does not cancel the normalised term (rtol
    covers it), absolute where it does (y near 0 while |beta| is not). The card's atol must cover the absolute part,
    or the eager outputs the card stores (and that a GPU check compares against) disagree with the op's exact math.
    The CPU kernel keeps its statistics in fp32; a card is made for the GPU either way."""

    unit: float
    groups: int
    span: int
    """Elements per (sample, group)."""
    eps: float


@dataclass(frozen=True)
class RoundedBeforeSum:
    """A chain whose eager calls round a batch norm's result to the 16-bit dtype and then add a residual to it
    (batch_norm_add_*). Each implementation computes the norm in its own fp32 order (the CPU's reference, CUDA's eager
    kernel, a candidate), so their roundings of it can land one step apart (2 * unit * |bn(x)|); where the sum then
    cancels (y near 0), y keeps that step as an absolute error, far above a norm's atol: the H100 saw 1 to 8 of 6 to
    26 M elements of ResNet-50's cards miss atol 1e-3 by up to 3.7x. The card's atol covers the step at the largest
    |bn(x)| (`cards.sum_tolerance`)."""

    unit: float
    eps: float
    channel_axis: int
    """c's axis in the card's x ([n, c, hw]: 1, channels-last [n, hw, c]: 2)."""


@dataclass(frozen=True)
class CardPlan:
    """How a variant becomes a card (the data comes later, from the sampled calls)."""

    family: OpFamily
    op: str
    """Short name for the card's name (and, for elementwise cards, the operation the template reads from it)."""
    dtype: str
    sizes: dict[str, int]
    tensors: list[PlannedTensor]
    flops: str
    source: str
    plan: LaunchPlan
    what: str
    """What the card computes, in words."""
    tolerance: Tolerance | None = None
    template_problem: str | None = None
    """Why the template library cannot serve this card even though it has the family (None: it can, if the
    proposer's own check agrees)."""
    notes: list[str] = field(default_factory=list)
    rounded_statistics: RoundedStatistics | None = None
    """Set when eager rounds statistics to a 16-bit dtype: the card's atol is widened by what that costs on the
    captured data (`cards.statistics_tolerance`)."""
    rounded_before_sum: RoundedBeforeSum | None = None
    """Set when eager rounds a norm's result to a 16-bit dtype before a residual add: the card's atol is widened
    by one rounding step of it (`cards.sum_tolerance`)."""
    stress_skip: dict[str, str] = field(default_factory=dict)
    """Stress sets of the family the card does not run, with why."""
    eps: float | None = None
    """A norm's eps, as its baseline has it baked in."""
    chain: Chain | None = None
    """A fused chain's calls and wiring (`chain_record`), which the card records."""
    call: ChainStep | None = None
    """A single-call card's call with its scalars (`call_record`), which the card records."""
    rounded_source: str | None = None
    """A chain's baseline that keeps its intermediate results in the card's dtype, as eager does: the card's
    baseline when its reference does (`Chain.rounded`)."""
    precisions: tuple[str, ...] = ()
    """The reference's precisions to try, in order (`capture.cards`); empty: the family's."""
    replay: list[Step] = field(default_factory=list)
    """The calls the reference re-runs instead of the captured ones, where those have no CPU kernel (CUDA's attention
    overloads, re-run as the CPU's flash attention with the same tensors and scalars); empty: the captured calls."""

    def bindings(self) -> list[Binding]:
        return [
            Binding(
                tensor=t.name,
                role=t.role,
                step=t.step,
                path=t.path,
                op_shape=list(t.meta.shape),
                card_shape=_eval_dims(t.dims, self.sizes),
                order=list(t.order),
            )
            for t in self.tensors
        ]

    def input_places(self) -> dict[tuple[int, str], str]:
        """Every (step, path) that reads a card input, with the input's name."""
        places: dict[tuple[int, str], str] = {}
        for t in self.tensors:
            if t.role == "input":
                places |= dict.fromkeys([(t.step, t.path), *t.reads], t.name)
        return places

    def bytes_formula(self) -> str:
        return " + ".join(f"{NUMPY[t.meta.dtype].itemsize} * {_product(t.dims)}" for t in self.tensors)

    def bytes_per_call(self) -> int:
        total = 0
        for t in self.tensors:
            total += NUMPY[t.meta.dtype].itemsize * t.meta.numel
        return total


@dataclass(frozen=True)
class NoCard:
    status: Literal["unsupported", "no-kernel"]
    reason: str


def _eval_dims(dims: list[str | int], sizes: dict[str, int]) -> list[int]:
    return [d if isinstance(d, int) else sizes[d] for d in dims]


def _product(dims: list[str | int]) -> str:
    return " * ".join(str(d) for d in dims) or "1"


def _short(dtype: str) -> str:
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(dtype, dtype)


def _arg(step: Step, path: str) -> ArgSpec | None:
    for a in step.args:
        if a.path == path:
            return a
    return None


def _value(step: Step, path: str, kwarg: str | None = None) -> object:
    """A scalar argument by position, else by keyword; None when absent."""
    found = _arg(step, path) or (_arg(step, f"kwargs.{kwarg}") if kwarg else None)
    return None if found is None else found.value


class Refuse(Exception):
    """A variant that cannot become a card, with the reason."""


def _tensor(step: Step, path: str, what: str) -> TensorMeta:
    found = _arg(step, path)
    if found is None or found.kind == "none":
        raise Refuse(f"no {what} (it is None): the card family needs one")
    if found.tensor is None:
        raise Refuse(f"{what} is a {found.kind} ({found.value!r}), not a tensor")
    return found.tensor


def _output(step: Step, index: int) -> TensorMeta:
    if index >= len(step.outputs) or step.outputs[index] is None:
        raise Refuse(f"output {index} is not a tensor")
    meta = step.outputs[index]
    assert meta is not None
    return meta


def _checked(tensors: list[PlannedTensor]) -> str:
    """The one dtype of the card's tensors, after the layout rules every card shares."""
    for t in tensors:
        if not t.meta.shape:
            raise Refuse(f"{t.name} is a 0-dim tensor: cards hold arrays")
        if not t.meta.contiguous and not t.order:  # a permuted tensor's strides were checked by its family
            raise Refuse(
                f"non-contiguous {t.name}: shape {t.meta.shape}, strides {t.meta.stride}; a card's tensors are "
                "row-major contiguous"
            )
        if t.meta.numel == 0:
            raise Refuse(f"{t.name} is empty (shape {t.meta.shape})")
    dtypes = sorted({t.meta.dtype for t in tensors})
    if len(dtypes) != 1:
        raise Refuse(f"mixed dtypes: {dtypes}; a captured card's tensors share one dtype")
    if dtypes[0] not in baselines.DTYPES:
        raise Refuse(f"dtype {dtypes[0]}: cards are made for {', '.join(baselines.DTYPES)}")
    devices = {t.meta.device for t in tensors}
    if len(devices) != 1:
        raise Refuse(f"tensors on several devices {sorted(devices)}")
    return dtypes[0]


def _dims(shape: list[int], prefix: str = "d") -> tuple[dict[str, int], list[str | int]]:
    sizes = {f"{prefix}{k}": n for k, n in enumerate(shape)}
    return sizes, list(sizes)


def _row_sizes(x: TensorMeta) -> dict[str, int]:
    cols = x.shape[-1]
    return {"rows": x.numel // cols, "cols": cols}


# ---- elementwise ---------------------------------------------------------------------------------------------------

UNARY = {"aten.silu.default": "silu", "aten.relu.default": "relu", "aten.gelu.default": "gelu"}
BINARY = {"aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul"}


def _elementwise(op: str, inputs: list[tuple[str, int, str, TensorMeta]], out: tuple[int, TensorMeta]) -> CardPlan:
    """An elementwise card: inputs (name, step, path, meta) and the output (step, meta), all of one shape."""
    step_out, meta_out = out
    for name, _, _, meta in inputs:
        if meta.shape != meta_out.shape:
            shapes = [m.shape for _, _, _, m in inputs]
            raise Refuse(
                f"broadcast operands: shapes {shapes} make {meta_out.shape} ({name} differs); the elementwise family "
                "takes operands of the output's shape"
            )
    sizes, dims = _dims(meta_out.shape)
    tensors = [PlannedTensor(n, "input", s, p, m, dims) for n, s, p, m in inputs]
    tensors.append(PlannedTensor("y", "output", step_out, "out[0]", meta_out, dims))
    dtype = _checked(tensors)
    count = _product(dims)
    source, plan = baselines.elementwise(op, dtype, [n for n, _, _, _ in inputs], "y", count)
    return CardPlan(
        family="elementwise",
        op=op,
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops=f"{ELEMENTWISE_FLOPS[op]} * {count}",
        source=source,
        plan=plan,
        what=f"y = {op}({', '.join(n for n, _, _, _ in inputs)}) element by element",
    )


def _unary(step: Step) -> CardPlan:
    op = UNARY[step.op]
    if op == "gelu" and _value(step, "args[1]", "approximate") == "tanh":
        op = "gelu_tanh"
    return _elementwise(op, [("x", 0, "args[0]", _tensor(step, "args[0]", "input"))], (0, _output(step, 0)))


def _binary(step: Step) -> CardPlan:
    op = BINARY[step.op]
    other = _arg(step, "args[1]")
    if other is not None and other.kind == "scalar":
        raise Refuse(f"a scalar operand: {other.value!r}; the elementwise family takes two tensors of one shape")
    alpha = _value(step, "args[2]", "alpha")
    if alpha not in (None, 1):
        raise Refuse(f"alpha = {alpha!r}: the elementwise family adds with alpha 1")
    a = _tensor(step, "args[0]", "first operand")
    b = _tensor(step, "args[1]", "second operand")
    return _elementwise(op, [("a", 0, "args[0]", a), ("b", 0, "args[1]", b)], (0, _output(step, 0)))


def _silu_mul(steps: list[Step]) -> CardPlan:
    silu, mul = steps
    up = next(a for a in mul.args if a.kind == "tensor" and a.source != (0, 0))
    assert up.tensor is not None
    return _elementwise(
        "silu_mul",
        [("gate", 0, "args[0]", _tensor(silu, "args[0]", "gate")), ("up", 1, up.path, up.tensor)],
        (1, _output(mul, 0)),
    )


# ---- rows: softmax, rms_norm, layer_norm ---------------------------------------------------------------------------


def _softmax(step: Step) -> CardPlan:
    x = _tensor(step, "args[0]", "input")
    dim = _value(step, "args[1]")
    if dim not in (-1, len(x.shape) - 1):
        raise Refuse(f"softmax over dim {dim} of a {len(x.shape)}-dim tensor: the family reduces the last axis")
    if _value(step, "args[2]"):
        raise Refuse("half_to_float (a half input with an fp32 output): a captured card keeps one dtype")
    sizes = _row_sizes(x)
    tensors = [
        PlannedTensor("x", "input", 0, "args[0]", x, ["rows", "cols"]),
        PlannedTensor("y", "output", 0, "out[0]", _output(step, 0), ["rows", "cols"]),
    ]
    dtype = _checked(tensors)
    source, plan = baselines.softmax(dtype)
    return CardPlan(
        family="softmax",
        op="softmax",
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops="5 * rows * cols",
        source=source,
        plan=plan,
        what=f"y = softmax(x) over the last axis of x{x.shape}, seen by the card as [rows, cols]",
        tolerance=_softmax_tolerance(dtype, sizes["cols"]),
        notes=["atol is about 1% of rtol / cols (fp32) or 1e-8 (16-bit): outputs are about 1/cols"],
    )


def _softmax_tolerance(dtype: str, cols: int) -> Tolerance:
    """rtol by dtype; atol about 1% of rtol / cols for fp32 (outputs are about 1/cols), 1e-8 for 16-bit."""
    rtol = 1e-5 if dtype == "float32" else (1.6e-2 if dtype == "bfloat16" else 1e-3)
    return Tolerance(rtol=rtol, atol=1e-2 * rtol / cols if dtype == "float32" else 1e-8)


def _rows_plan(
    family: OpFamily,
    x: tuple[int, str, TensorMeta],
    weights: list[tuple[str, int, str, TensorMeta]],
    y: tuple[int, TensorMeta],
    eps: float,
) -> CardPlan:
    step_x, path_x, meta_x = x
    cols = meta_x.shape[-1]
    for name, _, _, meta in weights:
        if meta.shape != [cols]:
            raise Refuse(f"{name} has shape {meta.shape}: the family takes a weight of the last axis ({cols})")
    tensors = [PlannedTensor("x", "input", step_x, path_x, meta_x, ["rows", "cols"])]
    tensors += [PlannedTensor(n, "input", s, p, m, ["cols"]) for n, s, p, m in weights]
    tensors.append(PlannedTensor("y", "output", y[0], "out[0]", y[1], ["rows", "cols"]))
    dtype = _checked(tensors)
    if family == "rms_norm":
        source, plan = baselines.rms_norm(dtype, eps)
        what, flops, tolerance = "y = x * rsqrt(mean(x^2) + eps) * w over the last axis", "4 * rows * cols", None
    else:
        source, plan = baselines.layer_norm(dtype, eps)
        what, flops = "y = (x - mean) * rsqrt(var + eps) * w + b over the last axis", "8 * rows * cols"
        tolerance = _norm_tolerance(dtype)
    expected = TEMPLATE_EPS[family]
    problem = None
    if abs(eps - expected) > 1e-3 * expected:
        problem = f"eps {eps:g}: the template library's {family} kernels are written with eps {expected:g}"
    return CardPlan(
        family=family,
        op=family,
        dtype=dtype,
        sizes=_row_sizes(meta_x),
        tensors=tensors,
        flops=flops,
        source=source,
        plan=plan,
        what=f"{what}, eps {eps:g}; x{meta_x.shape} seen by the card as [rows, cols]",
        tolerance=tolerance,
        template_problem=problem,
        eps=eps,
    )


def _eps(value: object, dtype: str) -> float:
    if value is None:
        return FINFO_EPS.get(dtype, 2.0**-23)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise Refuse(f"eps {value!r} is not a number")
    return float(value)


def _fused_rms_norm(step: Step) -> CardPlan:
    x = _tensor(step, "args[0]", "input")
    shape = _value(step, "args[1]")
    if shape != [x.shape[-1]]:
        raise Refuse(f"normalized_shape {shape}: the family normalises the last axis only")
    w = _tensor(step, "args[2]", "weight")
    eps = _eps(_value(step, "args[3]", "eps"), x.dtype)
    plan = _rows_plan("rms_norm", (0, "args[0]", x), [("w", 0, "args[2]", w)], (0, _output(step, 0)), eps)
    if len(step.outputs) < 2:
        return plan
    rstd = step.outputs[1]
    return _with_note(  # carrying it would leave the template library's rms_norm kernels (x, w -> y) unable to serve
        plan,
        f"the op's rstd output{'' if rstd is None else ' ' + str(rstd.shape)} (for backward) is not part of the card: "
        "its kernels write y only, so a .cast package leaves this call (which must return both) to eager PyTorch",
    )


def _rms_pattern(steps: list[Step]) -> CardPlan:
    x = _tensor(steps[0], "args[0]", "input")
    add = next(s for s in steps if s.op.startswith(("aten.add.", "aten.add_.")))
    eps = _eps(_value(add, "args[1]"), x.dtype)
    weighted_at = max(k for k, s in enumerate(steps) if s.op == "aten.mul.Tensor")
    weighted = steps[weighted_at]
    w = next(a for a in weighted.args if a.kind == "tensor" and a.source is None)
    assert w.tensor is not None
    last = len(steps) - 1
    made = _rows_plan(
        "rms_norm", (0, "args[0]", x), [("w", weighted_at, w.path, w.tensor)], (last, _output(steps[last], 0)), eps
    )
    if steps[0].op == "aten._to_copy.default":
        return made
    normed_at = min(k for k, s in enumerate(steps) if s.op == "aten.mul.Tensor")  # x * rsqrt(...) reads x again
    again = tuple((normed_at, a.path) for a in steps[normed_at].args if a.kind == "tensor" and a.source is None)
    tensors = [dataclasses.replace(t, reads=again) if t.name == "x" else t for t in made.tensors]
    return dataclasses.replace(made, tensors=tensors)


def _layer_norm(step: Step) -> CardPlan:
    x = _tensor(step, "args[0]", "input")
    shape = _value(step, "args[1]")
    if shape != [x.shape[-1]]:
        raise Refuse(f"normalized_shape {shape}: the family normalises the last axis only")
    w = _tensor(step, "args[2]", "weight")
    b = _tensor(step, "args[3]", "bias")
    eps = _eps(_value(step, "args[4]", "eps"), x.dtype)
    plan = _rows_plan(
        "layer_norm", (0, "args[0]", x), [("w", 0, "args[2]", w), ("b", 0, "args[3]", b)], (0, _output(step, 0)), eps
    )
    return _with_note(plan, "the op's mean and rstd outputs (for backward) are not part of the card")


def _with_note(plan: CardPlan, note: str) -> CardPlan:
    return dataclasses.replace(plan, notes=[*plan.notes, note])


# ---- group norm, batch norm, pooling -------------------------------------------------------------------------------


STATISTICS_OF_INF = (
    "torch's mean of a group holding +-inf is inf or NaN depending on where the inf falls in its Welford order (the "
    "float64 reference gives NaN for some such groups, inf for others), so no kernel's mean and rstd outputs can "
    "match it there"
)


def _group_norm(step: Step) -> CardPlan:
    x = _tensor(step, "args[0]", "input")
    gamma = _tensor(step, "args[1]", "weight")
    beta = _tensor(step, "args[2]", "bias")
    n, c, hw, groups = (_value(step, f"args[{k}]") for k in (3, 4, 5, 6))
    eps = _eps(_value(step, "args[7]"), x.dtype)
    if not all(isinstance(v, int) for v in (n, c, hw, groups)):
        raise Refuse(f"N, C, HxW, group = {n}, {c}, {hw}, {groups}: not integers")
    assert isinstance(c, int) and isinstance(hw, int) and isinstance(n, int) and isinstance(groups, int)
    h, w = (x.shape[2], x.shape[3]) if len(x.shape) == 4 else (hw, 1)
    sizes = {"n": n, "c": c, "h": h, "w": w, "groups": groups}
    tensors = [
        PlannedTensor("x", "input", 0, "args[0]", x, ["n", "c", "h", "w"]),
        PlannedTensor("gamma", "input", 0, "args[1]", gamma, ["c"]),
        PlannedTensor("beta", "input", 0, "args[2]", beta, ["c"]),
        PlannedTensor("y", "output", 0, "out[0]", _output(step, 0), ["n", "c", "h", "w"]),
        PlannedTensor("mean", "output", 0, "out[1]", _output(step, 1), ["n", "groups"]),
        PlannedTensor("rstd", "output", 0, "out[2]", _output(step, 2), ["n", "groups"]),
    ]
    dtype = _checked(tensors)
    source, plan = baselines.group_norm(dtype, eps)
    problem = None
    if abs(eps - TEMPLATE_EPS["group_norm"]) > 1e-8:
        problem = f"eps {eps:g}: the template library's group_norm kernels are written with eps 1e-05"
    return CardPlan(
        family="group_norm",
        op="group_norm",
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops="8 * n * c * h * w",
        source=source,
        plan=plan,
        what=f"y = group_norm(x, {groups} groups) * gamma + beta over x{x.shape} (NCHW), eps {eps:g}",
        tolerance=_norm_tolerance(dtype),
        template_problem=problem,
        notes=["the op's mean and rstd outputs [n, groups] are outputs of the card: a .cast call must return them"],
        stress_skip={"nan-inf": STATISTICS_OF_INF},
        eps=eps,
        rounded_statistics=(
            RoundedStatistics(UNIT_ROUNDOFF[dtype], groups, c // groups * h * w, eps)
            if dtype in UNIT_ROUNDOFF
            else None
        ),
    )


def _norm_tolerance(dtype: str) -> Tolerance:
    """A normalisation's tolerance: fp32 tight; 16-bit with atol 1e-3, since outputs near zero after the mean is
    taken out carry the rounding of the inputs' scale, not their own."""
    return Tolerance(rtol=1e-5, atol=1e-5) if dtype == "float32" else Tolerance(rtol=1.6e-2, atol=1e-3)


def _batch_norm(step: Step) -> CardPlan:
    training_at, eps_at = patterns.BATCH_NORM[step.op]
    if training_at is not None and _value(step, f"args[{training_at}]") is not False:
        raise Refuse("batch norm in training mode (batch statistics): call model.eval() for inference")
    x = _tensor(step, "args[0]", "input")
    if len(x.shape) < 2:
        raise Refuse(f"input of shape {x.shape}: batch norm over [N, C, ...]")
    names = [("w", "args[1]", "weight"), ("b", "args[2]", "bias"), ("mean", "args[3]", "running_mean")]
    names.append(("var", "args[4]", "running_var"))
    hw = x.numel // (x.shape[0] * x.shape[1])
    sizes = {"n": x.shape[0], "c": x.shape[1], "hw": hw}
    tensors = [PlannedTensor("x", "input", 0, "args[0]", x, ["n", "c", "hw"])]
    tensors += [PlannedTensor(name, "input", 0, path, _tensor(step, path, what), ["c"]) for name, path, what in names]
    tensors.append(PlannedTensor("y", "output", 0, "out[0]", _output(step, 0), ["n", "c", "hw"]))
    dtype = _checked(tensors)
    eps = _eps(_value(step, f"args[{eps_at}]"), dtype)
    source, plan = baselines.batch_norm(dtype, eps)
    return CardPlan(
        family="other",
        op="batch_norm",
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops="4 * n * c * hw",
        source=source,
        plan=plan,
        what=f"y = (x - mean[c]) * rsqrt(var[c] + eps) * w[c] + b[c] (batch norm, eval) over x{x.shape}, eps {eps:g}",
        tolerance=_norm_tolerance(dtype),
        template_problem="the template library has no batch norm family (an LLM proposer can serve the card)",
        notes=["family 'other': no stress sets are written for it yet"],
    )


def _pool(x: TensorMeta, y: TensorMeta, path: str) -> CardPlan:
    if len(x.shape) != 4:
        raise Refuse(f"input of shape {x.shape}: pooling cards take NCHW")
    n, c, h, w = x.shape
    if y.numel != n * c:
        raise Refuse(f"output {y.shape}: pooling cards pool each plane to 1x1")
    sizes = {"n": n, "c": c, "h": h, "w": w}
    y_dims: list[str | int] = ["n", "c", *([1] * (len(y.shape) - 2))]
    tensors = [
        PlannedTensor("x", "input", 0, path, x, ["n", "c", "h", "w"]),
        PlannedTensor("y", "output", 0, "out[0]", y, y_dims),
    ]
    dtype = _checked(tensors)
    source, plan = baselines.pooling(dtype)
    return CardPlan(
        family="pooling",
        op="avg_pool",
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops="n * c * h * w",
        source=source,
        plan=plan,
        what=f"y = mean of each h x w plane of x{x.shape} (adaptive average pooling to 1x1)",
    )


def _mean(step: Step) -> CardPlan:
    x = _tensor(step, "args[0]", "input")
    dims = _value(step, "args[1]")
    if _value(step, "kwargs.dtype") is not None:
        raise Refuse("a mean with a dtype argument: the card keeps the input's dtype")
    ndim = len(x.shape)
    normal = sorted(d % ndim for d in dims) if isinstance(dims, list) and all(isinstance(d, int) for d in dims) else []
    if ndim != 4 or normal != [2, 3]:
        raise Refuse(f"a mean over dims {dims} of a {ndim}-dim tensor: only NCHW planes (dims 2, 3) make pooling cards")
    return _pool(x, _output(step, 0), "args[0]")


def _adaptive_pool(step: Step) -> CardPlan:
    if _value(step, "args[1]") != [1, 1]:
        raise Refuse(f"output size {_value(step, 'args[1]')}: pooling cards pool to 1x1")
    return _pool(_tensor(step, "args[0]", "input"), _output(step, 0), "args[0]")


# ---- matrix products -----------------------------------------------------------------------------------------------

MATMUL_TOLERANCE = {
    "float32": Tolerance(rtol=1e-5, atol=1e-4),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=4e-3),
    "float16": Tolerance(rtol=1e-3, atol=1e-3),
}
"""rtol by dtype (the product's rounding to it); atol for outputs near zero, whose error is the sum's, not theirs: a
reordered fp32 sum, or cuBLAS's split-K partials rounded to bf16 (torch allows that reduced-precision reduction by
default), about 2^-8 of a partial sum at unit-scale activations and 1/sqrt(K)-scale weights."""
GEMM_ALIGNMENT = 16
"""Bytes of one cp.async copy of the GEMM template: a data pointer aligned to less is refused by it."""


def _operand_layout(meta: TensorMeta, what: str, batched: bool) -> bool:
    """Whether a matrix operand is row-major (True) or a transposed view of a row-major matrix (False), from its
    captured strides (those of dims of size 1 do not matter); Refuse for any other layout."""
    *lead, rows, cols = meta.shape
    if len(lead) != int(batched):
        raise Refuse(f"{what} has shape {meta.shape}: a {'batched ' if batched else ''}matrix product's operand")
    batch = [rows * cols] if batched else []
    for row_major, strides in ((True, [*batch, cols, 1]), (False, [*batch, 1, rows])):
        if all(n == 1 or s == want for n, s, want in zip(meta.shape, meta.stride, strides, strict=True)):
            return row_major
    raise Refuse(
        f"{what} has strides {meta.stride} for shape {meta.shape}: a matrix card takes a row-major operand or a "
        "transposed view of one, as it lies in memory"
    )


def _swapped(meta: TensorMeta) -> tuple[int, ...]:
    """The memory order of a transposed view: its last two dims swapped."""
    rank = len(meta.shape)
    return (*range(rank - 2), rank - 1, rank - 2)


def _product_plan(step: Step, op: str, a_path: str, b_path: str, bias_path: str | None) -> CardPlan:
    """y = a b (+ bias) of one mm, bmm or addmm call, its operands as the model laid them out."""
    a, b = _tensor(step, a_path, "first matrix"), _tensor(step, b_path, "second matrix")
    y = _output(step, 0)
    batched = len(y.shape) == 3
    a_row, b_row = _operand_layout(a, "a", batched), _operand_layout(b, "b", batched)
    *lead_sizes, m, k = a.shape
    n = b.shape[-1]
    sizes = {**({"batch": lead_sizes[0]} if batched else {}), "M": m, "N": n, "K": k}
    lead: list[str | int] = ["batch"] if batched else []
    a_dims, b_dims = (["M", "K"] if a_row else ["K", "M"]), (["K", "N"] if b_row else ["N", "K"])
    tensors = [
        PlannedTensor("a", "input", 0, a_path, a, [*lead, *a_dims], order=() if a_row else _swapped(a)),
        PlannedTensor("b", "input", 0, b_path, b, [*lead, *b_dims], order=() if b_row else _swapped(b)),
    ]
    if bias_path is not None:
        bias = _tensor(step, bias_path, "bias")
        if bias.shape != [n]:
            raise Refuse(f"bias of shape {bias.shape}: a matrix card adds a bias of the output's last dim ({n})")
        tensors.append(PlannedTensor("bias", "input", 0, bias_path, bias, ["N"]))
    tensors.append(PlannedTensor("y", "output", 0, "out[0]", y, [*lead, "M", "N"]))
    dtype = _checked(tensors)
    source, plan = baselines.matmul(dtype, a_row, b_row, bias_path is not None, batched)
    misaligned = [t.name for t in tensors if 0 < t.meta.alignment < GEMM_ALIGNMENT]
    layout = f"a {'[M, K]' if a_row else '[K, M] (transposed view)'}, b {'[K, N]' if b_row else '[N, K] (b^T)'}"
    return CardPlan(
        family="matmul",
        op=op,
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops=f"2 * {_product([*lead, 'M', 'N', 'K'])}",
        source=source,
        plan=plan,
        what=f"y = a b{' + bias' if bias_path else ''} ({op}), {layout}, y {[*lead_sizes, m, n]}",
        tolerance=MATMUL_TOLERANCE[dtype],
        template_problem=(
            f"{', '.join(misaligned)} captured under {GEMM_ALIGNMENT}-byte aligned: the GEMM template copies 16 bytes"
            if misaligned
            else None
        ),
        notes=["the baseline is a plain tiled kernel; the vendor's (cuBLAS, eager) time is the variant's measured one"],
    )


def _mm(step: Step) -> CardPlan:
    return _product_plan(step, "mm", "args[0]", "args[1]", None)


def _bmm(step: Step) -> CardPlan:
    return _product_plan(step, "bmm", "args[0]", "args[1]", None)


def _addmm(step: Step) -> CardPlan:
    beta, alpha = _value(step, "args[3]", "beta"), _value(step, "args[4]", "alpha")
    if beta not in (None, 1) or alpha not in (None, 1):
        raise Refuse(f"beta {beta!r}, alpha {alpha!r}: a matrix card computes a b + bias (beta and alpha 1)")
    return _product_plan(step, "addmm", "args[1]", "args[2]", "args[0]")


def _baddbmm(step: Step) -> CardPlan:
    """y = beta c + alpha a b of aten.baddbmm: the bmm's card with c (its `self`: [batch, M, N] or a broadcast of
    fewer dims, as captured) and the call's beta and alpha, baked into the baseline and re-run by the reference."""
    beta, alpha = _value(step, "args[3]", "beta"), _value(step, "args[4]", "alpha")
    beta, alpha = 1 if beta is None else beta, 1 if alpha is None else alpha
    if not isinstance(beta, (int, float)) or not isinstance(alpha, (int, float)):
        raise Refuse(f"beta {beta!r}, alpha {alpha!r}: a baddbmm card takes finite numbers")
    made = _product_plan(step, "baddbmm", "args[1]", "args[2]", None)
    c = _tensor(step, "args[0]", "added tensor (self)")
    full = {"batch": made.sizes["batch"], "M": made.sizes["M"], "N": made.sizes["N"]}
    names = list(full)[3 - len(c.shape) :] if len(c.shape) <= 3 else []
    if not names or any(n not in (1, full[name]) for name, n in zip(names, c.shape, strict=True)):
        raise Refuse(f"c (self) of shape {c.shape}: baddbmm adds a tensor that broadcasts to {list(full.values())}")
    dims: list[str | int] = [name if n == full[name] else 1 for name, n in zip(names, c.shape, strict=True)]
    params = tuple("0" if d == 1 else {"batch": "batch", "M": "row", "N": "col"}[str(d)] for d in dims)
    c_at = baselines.offset((), params, tuple(str(d) for d in dims))
    tensors = [*made.tensors[:2], PlannedTensor("c", "input", 0, "args[0]", c, dims), made.tensors[2]]
    dtype = _checked(tensors)
    scaled = baselines.Scaled(beta=float(beta), alpha=float(alpha), c_at=c_at)
    a_row, b_row = (not t.order for t in made.tensors[:2])
    source, launch = baselines.matmul(dtype, a_row, b_row, False, True, scaled=scaled)
    return dataclasses.replace(
        made,
        tensors=tensors,
        flops=f"{made.flops} + 2 * batch * M * N",
        source=source,
        plan=launch,
        what=f"y = {beta!r} c + {alpha!r} {made.what.removeprefix('y = ')}, c {c.shape}",
    )


def _product_act(steps: list[Step]) -> CardPlan:
    """mm, addmm or bmm, then an activation of its result: the product's card, y the activation's (the name says
    which: the GEMM template's epilogue reads it)."""
    product, act = steps
    made = OPS[product.op](product)
    name = _activation(act)
    layout = {t.name: not t.order for t in made.tensors if t.name in ("a", "b")}
    bias = any(t.name == "bias" for t in made.tensors)
    y = next(t for t in made.tensors if t.name == "y")
    tensors = [*(t for t in made.tensors if t.role == "input"), dataclasses.replace(y, step=1, meta=_output(act, 0))]
    dtype = _checked(tensors)
    batched = "batch" in made.sizes

    def baseline(rounded: bool) -> tuple[str, LaunchPlan]:
        return baselines.matmul(dtype, layout["a"], layout["b"], bias, batched, name, rounded)

    return dataclasses.replace(
        made,
        tensors=tensors,
        flops=f"{made.flops} + {ELEMENTWISE_FLOPS[name]} * {_product(y.dims)}",
        precisions=CHAIN_PRECISIONS,
        source=baseline(rounded=False)[0],
        rounded_source=baseline(rounded=True)[0],
        what=f"y = {name}({made.what.removeprefix('y = ')})",
    )


# ---- convolutions --------------------------------------------------------------------------------------------------

CONVOLUTION_TF32 = Tolerance(rtol=2e-3, atol=2e-3)
"""An fp32 convolution on CUDA: cuDNN runs it in TF32 (torch.backends.cudnn.allow_tf32 is on by default), each
product rounded to 10 bits of mantissa (2^-11 relative), which a sum over c * kh * kw products carries."""


def memory_order(meta: TensorMeta, what: str) -> tuple[int, ...]:
    """The dims of a dense tensor in the order they lie in memory, outermost first; empty when that is row-major
    (preferred where dims of size 1 leave the order open). Refuse for a tensor with gaps or overlaps (a slice, an
    expanded view): a card holds a tensor as it lies in memory, and such a one lies in no order."""
    rank = len(meta.shape)
    for order in itertools.permutations(range(rank)):
        expected = 1
        for d in reversed(order):
            if meta.shape[d] != 1 and meta.stride[d] != expected:
                break
            expected *= meta.shape[d]
        else:
            return () if order == tuple(range(rank)) else order
    raise Refuse(
        f"{what} has strides {meta.stride} for shape {meta.shape}: not dense in any order of its dims (a slice or a "
        "broadcast view); a card holds each tensor as it lies in memory"
    )


def _in_order(names: list[str], order: tuple[int, ...]) -> list[str | int]:
    """A tensor's card dims: its dims' names in memory order."""
    return [names[d] for d in order] if order else list(names)


def _convolution(step: Step) -> CardPlan:
    """y = conv(x, weight) (+ bias) of aten.convolution, 1-d or 2-d, each tensor in the layout the call had (NCHW,
    channels-last), stride, padding, dilation and groups as captured; the reference is the call itself."""
    x, w, y = _tensor(step, "args[0]", "input"), _tensor(step, "args[1]", "weight"), _output(step, 0)
    if _value(step, "args[6]"):
        raise Refuse("a transposed convolution (ConvTranspose): the convolution card computes a forward convolution")
    spatial = len(x.shape) - 2
    if spatial not in (1, 2):
        raise Refuse(f"a {spatial}-d convolution (input {x.shape}): convolution cards are 1-d or 2-d")
    scalars: dict[str, tuple[int, int]] = {}
    for name, path, height in (("stride", "args[3]", 1), ("padding", "args[4]", 0), ("dilation", "args[5]", 1)):
        value = _value(step, path)
        if not (isinstance(value, list) and len(value) == spatial and all(isinstance(v, int) for v in value)):
            raise Refuse(f"{name} {value!r}: a convolution card takes {spatial} integers")
        numbers = [v for v in value if isinstance(v, int)]
        scalars[name] = (numbers[0] if spatial == 2 else height, numbers[-1])  # a 1-d convolution has h = 1
    groups = _value(step, "args[8]")
    if not isinstance(groups, int):
        raise Refuse(f"groups {groups!r}: a convolution card takes an integer")
    names = {"x": ["n", "c", "h", "w"], "w": ["o", "cg", "kh", "kw"], "y": ["n", "o", "oh", "ow"]}
    if spatial == 1:
        names = {key: [v for k, v in enumerate(dims) if k != 2] for key, dims in names.items()}
    orders = {key: memory_order(meta, key) for key, meta in (("x", x), ("weight", w), ("y", y))}
    sizes = {
        **dict(zip(names["x"], x.shape, strict=True)),
        **dict(zip(names["w"], w.shape, strict=True)),
        **dict(zip(names["y"], y.shape, strict=True)),
        "groups": groups,
    }
    bias_arg = _arg(step, "args[2]")
    tensors = [
        PlannedTensor("x", "input", 0, "args[0]", x, _in_order(names["x"], orders["x"]), order=orders["x"]),
        PlannedTensor(
            "weight", "input", 0, "args[1]", w, _in_order(names["w"], orders["weight"]), order=orders["weight"]
        ),
    ]
    if bias_arg is not None and bias_arg.kind != "none":
        tensors.append(PlannedTensor("bias", "input", 0, "args[2]", _tensor(step, "args[2]", "bias"), ["o"]))
    tensors.append(PlannedTensor("y", "output", 0, "out[0]", y, _in_order(names["y"], orders["y"]), order=orders["y"]))
    dtype = _checked(tensors)
    conv = baselines.Convolution(
        spatial=spatial,
        stride=scalars["stride"],
        padding=scalars["padding"],
        dilation=scalars["dilation"],
        groups=groups,
        bias=len(tensors) == 4,
        orders=orders,
    )
    source, launch = baselines.convolution(dtype, conv)
    tf32 = dtype == "float32" and x.device.startswith("cuda")
    kernel = "x".join(str(k) for k in w.shape[2:])
    return CardPlan(
        family="convolution",
        op=f"conv{spatial}d",
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops=f"2 * {' * '.join(names['y'])} * cg * {' * '.join(names['w'][2:])}",
        source=source,
        plan=launch,
        what=(
            f"y = conv{spatial}d(x, weight){' + bias' if conv.bias else ''} ({kernel} kernel, stride "
            f"{_value(step, 'args[3]')}, padding {_value(step, 'args[4]')}, dilation {_value(step, 'args[5]')}, "
            f"groups {groups}) of x {x.shape} into y {y.shape}; {baselines.layouts(orders)}"
        ),
        tolerance=CONVOLUTION_TF32 if tf32 else MATMUL_TOLERANCE[dtype],
        notes=[
            "the baseline is a plain direct convolution; the vendor's (cuDNN, eager) time is the variant's measured "
            "one",
            *(["fp32 on CUDA: cuDNN computes in TF32 (torch.backends.cudnn.allow_tf32): rtol and atol 2e-3"] * tf32),
        ],
    )


# ---- attention -----------------------------------------------------------------------------------------------------

ATTENTION = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": ("args[3]", "args[4]", "kwargs.attn_mask"),
    "aten._scaled_dot_product_flash_attention.default": ("args[3]", "args[4]", ""),
    "aten._scaled_dot_product_efficient_attention.default": ("args[5]", "args[6]", "args[3]"),
    "aten._scaled_dot_product_cudnn_attention.default": ("args[5]", "args[6]", "args[3]"),
}
"""The overloads F.scaled_dot_product_attention runs as (CPU; CUDA's flash, memory-efficient and cuDNN kernels), with
the paths of their dropout_p, is_causal and mask (attn_mask / attn_bias; "": none) arguments."""
ATTENTION_REPLAY = "aten._scaled_dot_product_flash_attention_for_cpu.default"
"""What an attention card's reference re-runs on the CPU: the same tensors, dropout 0, is_causal and scale."""


def _attention(step: Step, read: set[int]) -> CardPlan:
    """y = softmax(scale q k^T [causal]) v of one scaled_dot_product_attention kernel, q, k, v and y in the layouts
    the call had (a [batch, seq, heads, dim] projection seen as [batch, heads, seq, dim]: a permuted card tensor),
    the output only (its logsumexp is for backward: refused when the model reads it)."""
    dropout_path, causal_path, mask_path = ATTENTION[step.op]
    dropout = _value(step, dropout_path, "dropout_p") or 0.0
    if dropout != 0.0:
        raise Refuse(
            f"dropout_p {dropout!r}: an attention card is deterministic (dropout 0, as inference runs it): capture the "
            "model in eval mode, or with dropout_p=0"
        )
    mask = _arg(step, mask_path) if mask_path else None
    if mask is not None and mask.kind == "tensor":
        raise Refuse("an attention mask or bias tensor: attention cards take none yet (is_causal is carded)")
    extra = sorted(read - {0})
    if extra:
        raise Refuse(
            f"the model reads out{extra} of {step.op} (the logsumexp, for backward): an attention card computes the "
            "output only; capture under torch.no_grad() or in eval mode"
        )
    q, k, v = (_tensor(step, f"args[{n}]", what) for n, what in enumerate(("query", "key", "value")))
    y = _output(step, 0)
    if not len(q.shape) == len(k.shape) == len(v.shape) == 4:
        raise Refuse(
            f"q, k, v of shapes {q.shape}, {k.shape}, {v.shape}: attention cards take [batch, heads, seq, dim]"
        )
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise Refuse(
            f"q {q.shape}, k {k.shape}, v {v.shape}: an attention card takes one batch and one number of heads for all "
            "three (no grouped-query broadcast) and the keys' dim of the queries"
        )
    if max(q.shape[3], v.shape[3]) > baselines.ATTENTION_HEAD_DIM:
        raise Refuse(f"head dim {max(q.shape[3], v.shape[3])}: the attention baseline holds up to 256 in registers")
    causal = bool(_value(step, causal_path, "is_causal"))
    given = _value(step, "kwargs.scale")
    scale = float(given) if isinstance(given, (int, float)) else q.shape[3] ** -0.5
    names = {
        "q": ["batch", "heads", "sq", "d"],
        "k": ["batch", "heads", "sk", "d"],
        "v": ["batch", "heads", "sk", "dv"],
        "y": ["batch", "heads", "sq", "dv"],
    }
    metas = {"q": q, "k": k, "v": v, "y": y}
    orders = {name: memory_order(meta, name) for name, meta in metas.items()}
    sizes = {"batch": q.shape[0], "heads": q.shape[1], "sq": q.shape[2], "sk": k.shape[2], "d": q.shape[3]}
    sizes["dv"] = v.shape[3]
    tensors = [
        PlannedTensor(
            name,
            "output" if name == "y" else "input",
            0,
            "out[0]" if name == "y" else f"args[{n}]",
            meta,
            _in_order(names[name], orders[name]),
            order=orders[name],
        )
        for n, (name, meta) in enumerate(metas.items())
    ]
    dtype = _checked(tensors)
    source, launch = baselines.attention(dtype, scale, causal, orders)
    arguments = [a for a in step.args if a.path in ("args[0]", "args[1]", "args[2]")]
    arguments += [
        ArgSpec(path="args[3]", kind="scalar", value=0.0),
        ArgSpec(path="args[4]", kind="scalar", value=causal),
        ArgSpec(path="kwargs.scale", kind="scalar", value=scale),
    ]
    return CardPlan(
        family="attention",
        op="attention",
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops="2 * batch * heads * sq * sk * (d + dv)",
        source=source,
        plan=launch,
        what=(
            f"y = softmax({scale:.6g} q k^T{' (causal: key j <= query i)' if causal else ''}) v of q {q.shape}, k "
            f"{k.shape}, v {v.shape} ({step.op}); {baselines.layouts(orders)}"
        ),
        tolerance=MATMUL_TOLERANCE[dtype],
        notes=[
            "the output only: the call's logsumexp (for backward) is read by nothing in the model",
            f"the reference re-runs it as {ATTENTION_REPLAY} (dropout 0, the call's is_causal and scale); the "
            "vendor's (eager) time is the variant's measured one",
        ],
        replay=[Step(op=ATTENTION_REPLAY, args=arguments, outputs=[y, None])],
    )


OPS: dict[str, Callable[[Step], CardPlan]] = {
    **dict.fromkeys(UNARY, _unary),
    **dict.fromkeys(BINARY, _binary),
    "aten._softmax.default": _softmax,
    "aten._fused_rms_norm.default": _fused_rms_norm,
    "aten.rms_norm.default": _fused_rms_norm,
    "aten.native_layer_norm.default": _layer_norm,
    "aten.native_group_norm.default": _group_norm,
    **dict.fromkeys(patterns.BATCH_NORM, _batch_norm),
    "aten.mean.dim": _mean,
    "aten._adaptive_avg_pool2d.default": _adaptive_pool,
    "aten.mm.default": _mm,
    "aten.bmm.default": _bmm,
    "aten.addmm.default": _addmm,
    "aten.convolution.default": _convolution,
    "aten.baddbmm.default": _baddbmm,
}


# ---- fused chains --------------------------------------------------------------------------------------------------

FP32_GELU = Tolerance(rtol=1e-5, atol=4e-6)
FP32_GELU_NOTE = (
    "atol 4e-6: fp32's 1 + erf(x / sqrt 2) cancels below x = -2.4, where the operator's own fp32 forms (the CPU's "
    "vectorised erf, CUDA's and glibc's erff) differ by a few ulps of 1 times |x| / 2 (1e-6 measured at x = -3.5, "
    "about 2e-6 at most down to x = -5.5, past which 1 + erf is 0 in fp32)"
)
CHAIN_PRECISIONS = ("stepwise", "float64", "captured")
"""A chain's reference is first each call exact and each intermediate result in its captured dtype, as eager stores
it (`capture.reference`): what a fused kernel that rounds where eager does computes."""
RESIDUAL_EQUAL_ROWS = (
    "x's rows are constant, r's are not: the normalised row x + r has a mean up to 2^30 times its spread, past what an "
    "fp32 kernel's mean can hold (large-mean covers cancellation at the ratio the card's atol allows)"
)


def _shifted(tensors: list[PlannedTensor], by: int) -> list[PlannedTensor]:
    return [dataclasses.replace(t, step=t.step + by) for t in tensors]


def _norm_of(steps: list[Step]) -> CardPlan:
    """The plan of the norm a residual chain ends in: one aten call, or the decomposed rms_norm pattern."""
    if len(steps) > 1:
        return _rms_pattern(steps)
    if steps[0].op == "aten.native_layer_norm.default":
        return _layer_norm(steps[0])
    return _fused_rms_norm(steps[0])


def _residual_norm(steps: list[Step], kept: bool = False) -> CardPlan:
    """x + r, then layer_norm or rms_norm of the sum: the norm's card with r beside x; `kept`: the sum s is an output
    too (the model reads it again)."""
    norm = _norm_of(steps[1:])
    assert norm.eps is not None
    tensors = [
        PlannedTensor("x", "input", 0, "args[0]", _tensor(steps[0], "args[0]", "input"), ["rows", "cols"]),
        PlannedTensor("r", "input", 0, "args[1]", _tensor(steps[0], "args[1]", "residual"), ["rows", "cols"]),
        *(t for t in _shifted(norm.tensors, 1) if t.role == "input" and t.name != "x"),
        *([PlannedTensor("s", "output", 0, "out[0]", _output(steps[0], 0), ["rows", "cols"])] if kept else []),
        *(t for t in _shifted(norm.tensors, 1) if t.role == "output"),
    ]
    dtype = _checked(tensors)
    maker = baselines.rms_norm if norm.family == "rms_norm" else baselines.layer_norm
    source, launch = maker(dtype, norm.eps, residual=True, kept=kept)
    skip = {"equal-rows": RESIDUAL_EQUAL_ROWS} if norm.family == "layer_norm" else {}
    what = f"the residual sum s = x + r, then {norm.what.replace('x *', 's *').replace('(x -', '(s -')}"
    return dataclasses.replace(
        norm,
        tensors=tensors,
        stress_skip={**norm.stress_skip, **skip},
        precisions=CHAIN_PRECISIONS,
        flops=f"{norm.flops} + rows * cols",
        source=source,
        rounded_source=maker(dtype, norm.eps, residual=True, rounded=True, kept=kept)[0],
        plan=launch,
        what=what + ("; s is written too (the model reads it again)" if kept else ""),
        template_problem=None,  # the chain template reads the eps from the chain, any eps
        notes=["the norm's other results (mean, rstd: for backward) are read by nothing in the model"],
    )


def _activation(step: Step) -> str:
    """The ELEMENTWISE name of a chain's last call (gelu, gelu_tanh, silu, relu; in place or not)."""
    op = UNARY[patterns.functional(step.op)]
    return "gelu_tanh" if op == "gelu" and _value(step, "args[1]", "approximate") == "tanh" else op


def _bias_act(steps: list[Step]) -> CardPlan:
    """x + b with b along the last axis of x, then an activation: y = act(x + b)."""
    add, act = steps
    first, second = _tensor(add, "args[0]", "first operand"), _tensor(add, "args[1]", "second operand")
    (x, x_path), (b, b_path) = sorted([(first, "args[0]"), (second, "args[1]")], key=lambda t: -len(t[0].shape))
    cols = x.shape[-1]
    tensors = [
        PlannedTensor("x", "input", 0, x_path, x, ["rows", "cols"]),
        PlannedTensor("b", "input", 0, b_path, b, ["cols"]),
        PlannedTensor("y", "output", 1, "out[0]", _output(act, 0), ["rows", "cols"]),
    ]
    dtype = _checked(tensors)
    name = _activation(act)
    source, launch = baselines.bias_act(name, dtype)
    cancels = dtype == "float32" and name.startswith("gelu")
    return CardPlan(
        family="elementwise",
        op=name,
        dtype=dtype,
        sizes={"rows": x.numel // cols, "cols": cols},
        tensors=tensors,
        flops=f"{1 + ELEMENTWISE_FLOPS[name]} * rows * cols",
        precisions=("stepwise-opmath", "stepwise", "captured"),
        source=source,
        rounded_source=baselines.bias_act(name, dtype, rounded=True)[0],
        plan=launch,
        what=f"y = {name}(x + b) with the bias b[cols] along the last axis of x{x.shape}, seen as [rows, cols]",
        tolerance=FP32_GELU if cancels else None,
        notes=[FP32_GELU_NOTE] if cancels else [],
    )


def _masked_softmax(steps: list[Step]) -> CardPlan:
    """[x * s or x / s] [+ mask] [cast] softmax over the last axis [cast]: y, with the mask broadcast over the rows
    (`patterns.mask_layout`)."""
    x = _tensor(steps[0], "args[0]", "input")
    scale: tuple[str, float] | None = None
    if steps[0].op in ("aten.mul.Tensor", "aten.div.Tensor"):
        value = _value(steps[0], "args[1]")
        assert isinstance(value, (int, float))
        scale = ("*" if steps[0].op == "aten.mul.Tensor" else "/", float(value))
    adds = [k for k, s in enumerate(steps) if s.op == "aten.add.Tensor"]
    sizes = _row_sizes(x)
    tensors = [PlannedTensor("x", "input", 0, "args[0]", x, ["rows", "cols"])]
    if adds:
        mask = _tensor(steps[adds[0]], "args[1]", "mask")
        layout = patterns.mask_layout(x.shape, mask.shape)
        assert layout is not None
        batch, heads, seq = layout
        sizes |= {"mask_rows": batch * seq, "heads": heads, "seq": seq}
        tensors.append(PlannedTensor("mask", "input", adds[0], "args[1]", mask, ["mask_rows", "cols"]))
    last = len(steps) - 1
    tensors.append(PlannedTensor("y", "output", last, "out[0]", _output(steps[last], 0), ["rows", "cols"]))
    dtype = _checked(tensors)
    source, launch = baselines.softmax(dtype, scale, bool(adds))
    rounded_source = baselines.softmax(dtype, scale, bool(adds), rounded=True)[0]
    base = _softmax_tolerance(dtype, sizes["cols"])
    logits = "x" + (f" {scale[0]} {scale[1]:g}" if scale else "") + (" + mask" if adds else "")
    broadcast = f", the mask [{sizes['mask_rows']}, cols] broadcast over the heads" if adds else ""
    return CardPlan(
        family="softmax",
        op="",
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops=f"{5 + (1 if scale else 0) + (1 if adds else 0)} * rows * cols",
        precisions=CHAIN_PRECISIONS,
        source=source,
        rounded_source=rounded_source,
        plan=launch,
        what=f"y = softmax({logits}) over the last axis of x{x.shape}, seen as [rows, cols]{broadcast}",
        tolerance=base,
        notes=["atol is about 1% of rtol / cols (fp32) or 1e-8 (16-bit): outputs are about 1/cols"],
    )


def _group_norm_act(steps: list[Step]) -> CardPlan:
    """group_norm, then an activation of its result: the group norm's card without its statistics (nothing reads
    them), y the activation's."""
    norm = _group_norm(steps[0])
    assert norm.eps is not None
    name = _activation(steps[1])
    inputs = [t for t in norm.tensors if t.role == "input"]
    y = PlannedTensor("y", "output", 1, "out[0]", _output(steps[1], 0), ["n", "c", "h", "w"])
    dtype = _checked([*inputs, y])
    source, launch = baselines.group_norm(dtype, norm.eps, name)
    return dataclasses.replace(
        norm,
        tensors=[*inputs, y],
        flops=f"{norm.flops} + {ELEMENTWISE_FLOPS[name]} * n * c * h * w",
        precisions=CHAIN_PRECISIONS,
        source=source,
        rounded_source=baselines.group_norm(dtype, norm.eps, name, rounded=True)[0],
        plan=launch,
        what=f"y = {name}(group_norm(x) * gamma + beta): {norm.what.removeprefix('y = ')}",
        notes=["the group norm's mean and rstd (for backward) are read by nothing in the model"],
    )


BATCH_NORM_FOLDED = (
    "the reference (torch's batch norm on the CPU, in float64) folds the statistics into x * (w * rstd) + (b - mean * "
    "w * rstd), which cancels where x and mean are large and close: {example}; no kernel can agree with it there"
)
BATCH_NORM_SKIPS = {
    "large": BATCH_NORM_FOLDED.format(example="x = mean = 2.9e36 with w * rstd = 8e10 gives 1.2e31 for b = -9e13"),
    "max-finite": BATCH_NORM_FOLDED.format(example="x, mean, w, b and var at FLT_MAX give 1.7e35, not FLT_MAX"),
    "nan-inf": "an infinite w, b, mean or var: the reference's folded form gives NaN (inf - inf) where CUDA's eager "
    "form, (x - mean) * rstd * w + b, and the kernel's give +-inf; the set puts them in every tensor alike",
}
BATCH_NORM_STATISTICS = (
    ("w", "args[1]", "weight"),
    ("b", "args[2]", "bias"),
    ("mean", "args[3]", "running_mean"),
    ("var", "args[4]", "running_var"),
)


def _batch_norm_act(steps: list[Step]) -> CardPlan:
    """Eval batch norm, [a residual add], then an activation: y = act(bn(x) [+ r]) over x[n, c, ...], x, r and y
    as they lie in memory (NCHW: [n, c, hw]; channels-last: [n, hw, c]), w, b, mean and var per channel."""
    norm, last = steps[0], steps[-1]
    x = _tensor(norm, "args[0]", "input")
    if len(x.shape) < 3:
        raise Refuse(f"input of shape {x.shape}: the chain's card takes a batch norm over [N, C, spatial...]")
    order = memory_order(x, "x")
    channels_last = (0, *range(2, len(x.shape)), 1)
    if order not in ((), channels_last):
        raise Refuse(f"x lies in memory in the order {list(order)} of its dims: the card takes NCHW or channels-last")
    dims: list[str | int] = ["n", "hw", "c"] if order else ["n", "c", "hw"]

    def laid_out(name: str, step: int, path: str, meta: TensorMeta) -> PlannedTensor:
        if memory_order(meta, name) != order:
            raise Refuse(f"{name} has strides {meta.stride}, x {x.stride}: the chain's tensors share one layout")
        role: Literal["input", "output"] = "output" if path.startswith("out") else "input"
        return PlannedTensor(name, role, step, path, meta, dims, order=order)

    tensors = [laid_out("x", 0, "args[0]", x)]
    tensors += [
        PlannedTensor(n, "input", 0, path, _tensor(norm, path, what), ["c"]) for n, path, what in BATCH_NORM_STATISTICS
    ]
    residual = len(steps) == 3
    if residual:
        path = next(a.path for a in steps[1].args if a.kind == "tensor" and a.source is None)
        tensors.append(laid_out("r", 1, path, _tensor(steps[1], path, "residual")))
    tensors.append(laid_out("y", len(steps) - 1, "out[0]", _output(last, 0)))
    dtype = _checked(tensors)
    eps = _eps(_value(norm, f"args[{patterns.BATCH_NORM[norm.op][1]}]"), dtype)
    name = _activation(last)
    sizes = {"n": x.shape[0], "c": x.shape[1], "hw": x.numel // (x.shape[0] * x.shape[1])}

    def baseline(rounded: bool) -> tuple[str, LaunchPlan]:
        return baselines.batch_norm(dtype, eps, baselines.NormAct(name, residual, bool(order), rounded))

    layout = "channels-last" if order else "NCHW"
    return CardPlan(
        family="elementwise",
        op=name,
        dtype=dtype,
        sizes=sizes,
        tensors=tensors,
        flops=f"{4 + int(residual) + ELEMENTWISE_FLOPS[name]} * n * c * hw",
        precisions=CHAIN_PRECISIONS,
        source=baseline(rounded=False)[0],
        rounded_source=baseline(rounded=True)[0],
        plan=baseline(rounded=False)[1],
        what=f"y = {name}(batch_norm(x){' + r' if residual else ''}) in eval mode (running statistics), eps {eps:g}, "
        f"over x{x.shape} ({layout}, seen as {[str(d) for d in dims]})",
        tolerance=_norm_tolerance(dtype),
        rounded_before_sum=(
            RoundedBeforeSum(UNIT_ROUNDOFF[dtype], eps, 2 if order else 1)
            if residual and dtype in UNIT_ROUNDOFF
            else None
        ),
        eps=eps,
        stress_skip=BATCH_NORM_SKIPS,
        notes=["the batch norm's saved statistics (for backward) are read by nothing in the model"],
    )


CHAIN_ARGS = ("scalar", "float", "dtype", "device", "layout", "memory_format")


def _recordable(value: Json) -> ChainValue | None:
    """A captured scalar as a chain holds it; None for one it cannot (None itself, a list holding None)."""
    if isinstance(value, list):
        items = [v for v in value if v is not None]
        return items if len(items) == len(value) else None
    return value


def chain_record(pattern: str, steps: list[Step], made: CardPlan) -> Chain:
    """The chain a card stands for (`cards.chain`): its calls and which of their results are the card's outputs;
    Refuse for an argument the record cannot hold."""
    outputs = {
        t.name: (t.step, int(t.path.removeprefix("out[").rstrip("]"))) for t in made.tensors if t.role == "output"
    }
    return Chain(pattern=pattern, steps=recorded_calls(steps, made), outputs=outputs)


def call_record(step: Step, made: CardPlan) -> ChainStep | None:
    """The one call a single-call card stands for, with the scalars it passed (`OperatorCard.call`): the call its
    reference replays where that is another overload (an attention's CPU flash attention, whose scalars lie at the
    same places whichever kernel CUDA ran); None where the record cannot hold one of its arguments (the card is
    still made: only a template that reads them refuses it)."""
    try:
        return recorded_calls([step], made)[0]
    except Refuse:
        return None


def recorded_calls(steps: list[Step], made: CardPlan) -> list[ChainStep]:
    """The calls as a card records them: each argument a card input, an earlier call's result or the scalar the call
    passed; Refuse for an argument the record cannot hold."""
    inputs = made.input_places()
    calls: list[ChainStep] = []
    for k, step in enumerate(steps):
        args: list[ChainArg] = []
        for arg in step.args:
            if arg.kind == "tensor" and arg.source is not None:
                args.append(ChainArg(path=arg.path, kind="step", step=arg.source[0], out=arg.source[1]))
            elif arg.kind == "tensor":
                name = inputs.get((k, arg.path))
                if name is None:
                    raise Refuse(f"call {k} ({step.op}) reads a tensor at {arg.path} that is no input of the card")
                args.append(ChainArg(path=arg.path, kind="input", input=name))
            elif arg.kind == "none":
                args.append(ChainArg(path=arg.path, kind="none"))
            elif arg.kind in CHAIN_ARGS and (value := _recordable(arg.value)) is not None:
                args.append(ChainArg(path=arg.path, kind=arg.kind, value=value))
            else:
                raise Refuse(f"call {k} ({step.op}) takes {arg.path} = {arg.value!r}, which a chain cannot record")
        calls.append(ChainStep(op=step.op, args=args, results=max(1, len(step.outputs))))
    return calls


PATTERNS: dict[str, Callable[[list[Step]], CardPlan]] = {
    "rms_norm": _rms_pattern,
    "silu_mul": _silu_mul,
    "residual_layer_norm": _residual_norm,
    "residual_rms_norm": _residual_norm,
    "residual_sum_layer_norm": functools.partial(_residual_norm, kept=True),
    "residual_sum_rms_norm": functools.partial(_residual_norm, kept=True),
    **{f"bias_{act}": _bias_act for act in ("gelu", "gelu_tanh", "silu", "relu")},
    **{f"group_norm_{act}": _group_norm_act for act in ("gelu", "gelu_tanh", "silu", "relu")},
    **{
        f"batch_norm_{add}{act}": _batch_norm_act
        for add in ("", "add_")
        for act in ("gelu", "gelu_tanh", "silu", "relu")
    },
    **{f"{op}_{act}": _product_act for op in ("mm", "addmm", "bmm") for act in ("gelu", "gelu_tanh", "silu", "relu")},
    "scale_softmax": _masked_softmax,
    "mask_softmax": _masked_softmax,
    "scale_mask_softmax": _masked_softmax,
}
"""Pattern name (`patterns.chain_name`) -> its card's plan (the chain record is added by `plan`)."""


def plan(group: Group) -> CardPlan | NoCard:
    """The card a variant becomes, or why it becomes none."""
    try:
        if group.kind == "pattern":
            made = PATTERNS[group.op](group.steps)
            return dataclasses.replace(made, op=group.op, chain=chain_record(group.op, group.steps, made))
        step = group.steps[0]
        if step.view:
            return NoCard("no-kernel", "a view (aliases its input): no kernel runs")
        if step.op.startswith(ALLOCATIONS):
            return NoCard("no-kernel", "an allocation: no kernel runs")
        if step.op.startswith(RESHAPES):
            return NoCard("no-kernel", "a reshape of a tensor nothing else holds (no copy): no kernel runs")
        if step.inplace:
            return NoCard(
                "unsupported",
                f"in-place ({step.op} writes its input): a card's kernel writes a separate output; an out-of-place "
                "call in the model (relu(x) rather than relu_(x), inplace=False) can become a card",
            )
        if step.op in ATTENTION:
            made = _attention(step, group.read[0] if group.read else {0})
        elif (handler := OPS.get(step.op)) is not None:
            made = handler(step)
        else:
            return NoCard("unsupported", _why_not(step.op))
        return dataclasses.replace(made, call=call_record(made.replay[0] if made.replay else step, made))
    except Refuse as exc:
        return NoCard("unsupported", str(exc))


def _why_not(op: str) -> str:
    if op.startswith(MATMUL_OPS):
        return "a matrix product (cuBLAS) other than mm, bmm, addmm and baddbmm: no card is made for it yet"
    if op.startswith(CONV_OPS):
        return "a convolution other than aten.convolution (forward, 1-d or 2-d): no card is made for it"
    if op.startswith(("aten._to_copy.", "aten.clone.", "aten.copy_.", "aten.cat.", "aten.contiguous")):
        return "a copy, cast or concatenation: no card family (it moves data the next kernel could read in place)"
    return f"no card family for {op}"


def card_name(plan: CardPlan, taken: set[str]) -> str:
    """`softmax_bf16_2x4x16x16`-style, unique among `taken` (the elementwise template reads the op from it)."""
    main = plan.tensors[0].meta.shape
    base = f"{plan.op}_{_short(plan.dtype)}_{'x'.join(str(d) for d in main)}"
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name
