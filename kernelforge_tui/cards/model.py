"""The operator card: what an operator is (sizes, tensors, tolerances, cost) and how to launch a kernel.

A card is a directory a person can read: `card.toml` (this model) plus `.npz` input sets. Every
boundary is a pydantic model, and every consistency rule says which field is wrong and how to fix it.
"""

from __future__ import annotations

import numbers
import re
from typing import Annotated, Literal

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from kernelforge_tui.cards import expr
from kernelforge_tui.cards.chain import Chain, ChainStep
from kernelforge_tui.cards.dtypes import FLOATING, NUMPY, DType
from kernelforge_tui.cards.errors import FieldProblem
from kernelforge_tui.cards.stress import check as check_stress


def _integer(value: object) -> object:
    """Refuse what pydantic's lax mode would turn into an integer: TOML's `"21"`, `21.0` and `true` (as 1) are typos
    or misreadings a card must not take silently."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        shown = str(value).lower() if isinstance(value, bool) else repr(value)
        raise FieldProblem(
            "", f"{shown} is a {type(value).__name__}, not an integer", "write a plain integer (no quotes, no '.0')"
        )
    return value


def _integer_or_formula(value: object) -> object:
    return value if isinstance(value, str) else _integer(value)


Integer = Annotated[int, BeforeValidator(_integer)]
"""An integer and nothing else (no bool, float or numeric string)."""
Expr = Annotated[str | int, BeforeValidator(_integer_or_formula)]
"""An integer, or an integer formula over the card's sizes (see `expr.HELP`)."""
Finite = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is a number: TOML's inf and nan, and literals beyond the float range (-1e400), are refused."""

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MAX_TENSOR_BYTES = 2**38
"""256 GiB: more than one GPU holds (an H200 has 141 GB), so no card that can run is refused, while a shape's element
and byte counts stay far below 2**63 and cannot overflow the int64 sizes of NumPy, the worker and a plan's args."""

OpFamily = Literal[
    "elementwise",
    "softmax",
    "rms_norm",
    "layer_norm",
    "group_norm",
    "pooling",
    "stencil",
    "matmul",
    "reduction",
    "copy",
    "scan",
    "sparse",
    "sort",
    "spectral",
    "convolution",
    "attention",
    "other",
]


class Strict(BaseModel):
    """Unknown keys are errors: a typo in a manifest must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Distribution(Strict):
    """How fresh inputs are drawn, so fresh sets look like the captured ones."""

    kind: Literal["normal", "uniform", "randint"] = "normal"
    mean: Finite = 0.0
    std: Finite = Field(default=1.0, ge=0)
    low: Finite = -1.0
    high: Finite = 1.0

    @model_validator(mode="after")
    def _range(self) -> Distribution:
        if self.kind == "randint" and int(self.high) <= int(self.low):
            raise FieldProblem(
                "high",
                f"randint draws from {int(self.low)} up to {int(self.high)}, an empty range",
                "raise high above low",
            )
        if self.kind == "uniform" and self.high < self.low:
            raise FieldProblem("high", f"{self.high} is below low = {self.low}", "give low <= high")
        return self


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (elements) of a row-major array of `shape`."""
    strides: list[int] = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


class TensorSpec(Strict):
    """One tensor argument: name, dtype, shape over named sizes, layout."""

    name: str
    dtype: DType
    shape: list[Expr]
    layout: Literal["row_major"] = "row_major"
    distribution: Distribution = Field(default_factory=Distribution)

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not IDENT.match(value):
            raise ValueError(f"{value!r} is not an identifier; use letters, digits and '_'")
        return value

    def dims(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """The concrete shape."""
        return tuple(expr.evaluate(dim, sizes) for dim in self.shape)

    def strides(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """Elements between consecutive indices of each dim: the card's array is row-major over its dims (which a
        captured card gives in the order they lay in memory)."""
        return contiguous_strides(self.dims(sizes))

    def numel(self, sizes: dict[str, int]) -> int:
        count = 1
        for dim in self.dims(sizes):
            count *= dim
        return count

    def nbytes(self, sizes: dict[str, int]) -> int:
        return self.numel(sizes) * NUMPY[self.dtype].itemsize


class Tolerance(Strict):
    """An output matches where |out - ref| <= atol + rtol * |ref| everywhere, and is never NaN."""

    rtol: Finite = Field(gt=0)
    atol: Finite = Field(ge=0)

    def accepts(self, out: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Where `out` matches `ref`, element by element: the rule the worker's `kf_compare_*` kernels apply on
        the GPU (gpu/helpers.cu), here on the host. A NaN reference needs a NaN (stress sets expect NaN where
        the operator propagates one), an infinite one the same infinity; a NaN output never matches a number."""
        o = np.asarray(out).astype(np.float64)
        e = np.asarray(ref).astype(np.float64)
        with np.errstate(invalid="ignore"):
            close = np.abs(o - e) <= self.atol + self.rtol * np.abs(e)
        infinite = np.isinf(e) | np.isinf(o)
        return np.where(np.isnan(e), np.isnan(o), np.where(infinite, o == e, close))


DEFAULT_TOLERANCE: dict[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-7, atol=1e-12),
    "float32": Tolerance(rtol=1e-5, atol=1e-8),
    "float16": Tolerance(rtol=1e-3, atol=1e-5),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-5),
}
"""Strict enough that a precision downgrade fails (fp32 computed in fp16 errs by 1e-3), loose enough
for a reordered reduction; bf16 follows PyTorch's `assert_close`. Integers must match exactly."""

EXACT = Tolerance(rtol=1e-30, atol=0.0)


class OutputSpec(TensorSpec):
    """An output tensor and the tolerance it is checked with."""

    tolerance: Tolerance | None = None

    def effective_tolerance(self) -> Tolerance:
        """The card's tolerance, else the per-dtype default (exact for integers)."""
        if self.tolerance is not None:
            return self.tolerance
        return DEFAULT_TOLERANCE.get(self.dtype, EXACT)


class Cost(Strict):
    """What the operator must do at least: for the roofline and the ceiling check."""

    flops: Expr = 0
    bytes: Expr = 0


class InputSet(Strict):
    """One set of inputs with reference outputs: a stored .npz file, or drawn from a seed."""

    name: str
    file: str | None = None
    seed: Integer | None = Field(default=None, ge=0)
    """NumPy's generators take non-negative seeds only."""

    @model_validator(mode="after")
    def _one_source(self) -> InputSet:
        if (self.file is None) == (self.seed is None):
            raise ValueError("give exactly one of `file` (an .npz in the card directory) or `seed`")
        return self


class StressSpec(Strict):
    """The card's stress input sets (cards/stress.py): every hard input its family defines, with the card's
    own shapes, drawn from `seed` and referenced by the card's NumPy reference. A card leaves one out only
    by naming it under `skip` with the reason, which is shown wherever the sets are listed."""

    seed: Integer = Field(default=0, ge=0)
    skip: dict[str, str] = Field(default_factory=dict)
    """Set name -> why this card does not run it."""

    @field_validator("skip")
    @classmethod
    def _reasons(cls, value: dict[str, str]) -> dict[str, str]:
        for name, reason in value.items():
            if not reason.strip():
                raise ValueError(f"skip.{name} has no reason: say why this card does not run the set")
        return value


class Reference(Strict):
    """Where reference outputs for fresh inputs come from."""

    kind: Literal["numpy", "baseline"] = "numpy"
    function: str | None = None
    """For numpy: a built-in name (`kernelforge_tui.cards.references`) or `file.py:function` in the card."""
    inputs: str | None = None
    """`file.py:function` in the card, `function(sizes, seed) -> {input: array}`: draws inputs with a structure no
    per-tensor distribution can say (sparse indices, a permutation, sample points). Without it every seeded, fresh
    and stress set is drawn from the tensors' distributions."""

    @model_validator(mode="after")
    def _function_given(self) -> Reference:
        if self.kind == "numpy" and not self.function:
            raise ValueError("a numpy reference needs `function` (a built-in name or 'file.py:function')")
        return self


SCALAR_TYPES = {"i32": "int32", "i64": "int64", "u32": "uint32", "u64": "uint64", "f32": "float32"}


class TensorMapSpec(Strict):
    """A TMA tensor map the harness encodes over one of the card's tensors (cuTensorMapEncodeTiled) and passes by
    value: a 128-byte CUtensorMap, which the kernel takes as `const __grid_constant__ CUtensorMap`.

    The candidate says only how it copies: the box, the shared-memory swizzle and the L2 promotion. The element type,
    the base address, the extent and the strides are the tensor's own (cards.plan.resolve), so a copy through the map
    cannot reach outside it. Dims count innermost first, the tensor's contiguous dim being the first; a box longer than
    the tensor's rank adds outer dims of extent 1 (CUTLASS maps a matrix as a batch of one)."""

    tensor: str
    box: list[int] = Field(min_length=1, max_length=5)
    """Elements of one copy along each dim, innermost first (1..256 each)."""
    swizzle: Literal[0, 32, 64, 128] = 0
    """Bytes of the shared-memory swizzle span (0: none); the box's inner row must fit in it."""
    l2_promotion: Literal[0, 64, 128, 256] = 128
    """Bytes the L2 fetches per miss (0: no promotion)."""


class LaunchPlan(Strict):
    """How to launch a candidate: data, never host code.

    `args` binds kernel parameters in order: a tensor name passes its device pointer; a name of `tensor_maps` passes
    that map by value, encoded by the harness over the launch's own tensor; anything else is an integer formula over
    the sizes, optionally typed with a suffix (`cols:i64`; default `i32`).
    """

    entry: str
    grid: list[Expr] = Field(min_length=1, max_length=3)
    block: list[Expr] = Field(min_length=1, max_length=3)
    shared_bytes: Expr = 0
    args: list[str]
    tensor_maps: dict[str, TensorMapSpec] = Field(default_factory=dict)
    """Argument name -> the TMA map it passes."""

    @model_serializer(mode="wrap")
    def _without_empty_maps(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """A plan without maps serialises as before they existed, so its candidates' identities stay themselves."""
        data: dict[str, object] = handler(self)
        if not self.tensor_maps:
            data.pop("tensor_maps", None)
        return data

    @field_validator("entry")
    @classmethod
    def _entry_identifier(cls, value: str) -> str:
        if not IDENT.match(value):
            raise ValueError(f"entry {value!r} is not a C identifier")
        return value


class BaselineSpec(Strict):
    """The kernel every speedup is measured against, timed beside each candidate."""

    source: str = "baseline.cu"
    plan: LaunchPlan


class OperatorCard(Strict):
    """The manifest `card.toml`."""

    format_version: Literal[1] = 1
    name: str
    family: OpFamily
    description: str = ""
    sizes: dict[str, Integer]
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[OutputSpec] = Field(min_length=1)
    cost: Cost = Field(default_factory=Cost)
    input_sets: list[InputSet] = Field(min_length=1)
    reference: Reference
    baseline: BaselineSpec | None = None
    stress: StressSpec = Field(default_factory=StressSpec)
    chain: Chain | None = None
    """For a card of several fused aten calls (a capture's chain): those calls and their wiring (`cards.chain`)."""
    call: ChainStep | None = None
    """For a card of one captured aten call: that call with the scalars it passed (a convolution's stride, padding,
    dilation and groups; an attention's scale and causality), which a template reads to serve the card."""

    @model_validator(mode="after")
    def _consistent(self) -> OperatorCard:
        for key, value in self.sizes.items():
            if not IDENT.match(key):
                raise FieldProblem(f"sizes.{key}", "not an identifier", "use letters, digits and '_'")
            if value <= 0:
                raise FieldProblem(f"sizes.{key}", f"{value} is not positive", "sizes must be integers >= 1")
        tensors = [t.name for t in [*self.inputs, *self.outputs]]
        clash = {n for n in tensors if tensors.count(n) > 1} | (set(tensors) & set(self.sizes))
        if clash:
            raise FieldProblem(
                "inputs/outputs/sizes",
                f"names used twice among tensors and sizes: {sorted(clash)}",
                "give every tensor and size its own name",
            )
        for group, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            for spec in specs:
                try:
                    dims = spec.dims(self.sizes)
                except expr.ExprError as exc:
                    raise FieldProblem(
                        f"{group}.{spec.name}.shape", str(exc), "use only names defined under [sizes]"
                    ) from None
                if any(d <= 0 for d in dims):
                    raise FieldProblem(
                        f"{group}.{spec.name}.shape", f"evaluates to {dims}", "every dimension must be >= 1"
                    )
                size = spec.nbytes(self.sizes)
                if size > MAX_TENSOR_BYTES:
                    raise FieldProblem(
                        f"{group}.{spec.name}.shape",
                        f"{dims} of {spec.dtype} is {size / 2**30:.3g} GiB, over the limit of "
                        f"{MAX_TENSOR_BYTES >> 30} GiB (more than a GPU holds)",
                        "use smaller sizes",
                    )
        for field in ("flops", "bytes"):
            try:
                expr.evaluate(getattr(self.cost, field), self.sizes)
            except expr.ExprError as exc:
                raise FieldProblem(f"cost.{field}", str(exc), expr.HELP) from None
        set_names = [s.name for s in self.input_sets]
        duplicates = sorted({n for n in set_names if set_names.count(n) > 1})
        if duplicates:
            raise FieldProblem("input_sets", f"names used twice: {duplicates}", "give every input set its own name")
        for out in self.outputs:
            if out.tolerance is not None and out.dtype not in FLOATING:
                raise FieldProblem(
                    f"outputs.{out.name}.tolerance",
                    f"a tolerance on a {out.dtype} output",
                    "remove it: integer outputs are compared exactly",
                )
        check_stress(self)
        if self.chain is not None:
            self._check_chain(self.chain)
        return self

    def _check_chain(self, chain: Chain) -> None:
        unknown = sorted(set(chain.input_names()) - {t.name for t in self.inputs})
        if unknown:
            raise FieldProblem("chain.steps", f"reads {unknown}, which are not inputs of the card", "fix the wiring")
        if set(chain.outputs) != {t.name for t in self.outputs}:
            raise FieldProblem(
                "chain.outputs",
                f"names {sorted(chain.outputs)}, the card's outputs are {[t.name for t in self.outputs]}",
                "name every output of the card once",
            )

    def tensor(self, name: str) -> TensorSpec:
        for spec in [*self.inputs, *self.outputs]:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def flops(self) -> int:
        return expr.evaluate(self.cost.flops, self.sizes)

    def set_bytes(self) -> int:
        """The host bytes of one input set with its reference outputs."""
        return sum(t.nbytes(self.sizes) for t in [*self.inputs, *self.outputs])

    def bytes_moved(self) -> int:
        return expr.evaluate(self.cost.bytes, self.sizes)
