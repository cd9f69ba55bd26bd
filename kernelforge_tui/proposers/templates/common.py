"""What every template shares: the parameter-space contract and the shared CUDA files they are built from.

Why one module: the families differ in their kernels, not in how a parameter set is checked,
canonicalised, rendered and described, nor in how fp32 math, 16-byte vectors and group reductions
are written (cuda/prelude.cuh, cuda/reduce.cuh). Sizes are known when a template renders (a card fixes
them), so templates check divisibility and capacity in Python and never emit a kernel that is wrong for
the card's sizes.

Parameters travel as plain dicts between the proposer, the tree and the store (a mutation is a dict with one value
changed); a template checks them into its own typed, frozen model (`valid`) and works on that. The model's
`as_dict` is the one serialisation a node stores and a candidate's identity hashes (vocabulary/identity.py).
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar, Generic, Literal, NamedTuple, Self, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kernelforge_tui.cards.chain import ChainValue
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.source import Value
from kernelforge_tui.vocabulary.identity import TemplateIdentity
from kernelforge_tui.vocabulary.nodes import ParamValue
from kernelforge_tui.vocabulary.profiles import Bottleneck

Params = dict[str, ParamValue]
Space = dict[str, tuple[ParamValue, ...]]

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
C_TYPE = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
SM_COUNT = 132
"""H200 streaming multiprocessors: grids sized in waves of resident blocks use it."""
MAX_DYNAMIC_SHARED = 227 * 1024 - 1024
"""Hopper's per-block shared memory, less a margin for the templates' static reduction scratch."""
STATIC_SHARED = 48 * 1024
"""The most shared memory a block may declare statically (without opting in to dynamic shared memory)."""
THREADS_PER_SM = 2048
"""Resident threads an SM holds at most: `minb` blocks of a size must fit in it."""
FAST_MATH_MIN_RTOL = 1e-5
"""The tightest output rtol under which a template may use fast intrinsics (__expf). __expf(x) errs by about
(|x| + 4) * 2^-24 relative (the rounding of x * log2(e), then ex2.approx's 2 ulp): under 2e-6 wherever a softmax
output stands above its atol, so fp32's 1e-5 holds with margin (the fp32 stress sets pass with it:
tests/cards/test_stress.py); a card that asks for less than 1e-5 gets the accurate expf only."""


class Lever(NamedTuple):
    """A parameter that addresses one bottleneck class: which way it helps along the space's order (`up`: towards
    later values, `down`: earlier ones, `any`: a change either way) and why, in a few words for the mutation."""

    param: str
    toward: Literal["up", "down", "any"]
    why: str

    def pulled(self, values: Sequence[ParamValue], old: ParamValue, new: ParamValue) -> bool:
        """Whether moving the parameter from `old` to `new` goes the lever's way."""
        if old == new or old not in values or new not in values:
            return False
        step = values.index(new) - values.index(old)
        return self.toward == "any" or (step > 0) == (self.toward == "up")


Levers = Mapping[Bottleneck, tuple[Lever, ...]]
"""Bottleneck class -> the levers that address it, the most telling first."""

WELL_KNOWN_LEVERS: Levers = {
    "memory_bandwidth": (
        Lever("vec", "up", "wider accesses"),
        Lever("storage", "down", "fewer passes over the data"),
    ),
    "memory_latency": (
        Lever("unroll", "up", "more loads in flight"),
        Lever("split", "up", "more blocks share the work"),
        Lever("minb", "up", "more resident blocks"),
        Lever("rpb", "any", "rows per block"),
        Lever("tpr", "any", "threads per row"),
        Lever("block", "any", "block size"),
    ),
    "compute": (
        Lever("fast_exp", "up", "fast exp"),
        Lever("vec", "up", "fewer instructions per element"),
    ),
}
"""The levers of parameters whose names mean the same in every template: the default of a template that declares
none (those its space lacks are ignored)."""

STREAMING_LEVERS: Levers = {
    "memory_bandwidth": (
        Lever("vec", "up", "wider accesses"),
        Lever("unroll", "up", "more bytes in flight per thread"),
    ),
    "memory_latency": (
        Lever("unroll", "up", "more loads in flight"),
        Lever("minb", "up", "more resident blocks"),
        Lever("waves", "up", "more blocks in flight"),
        Lever("block", "any", "block size"),
    ),
    "compute": (
        Lever("vec", "up", "fewer instructions per element"),
        Lever("unroll", "up", "fewer loop instructions per element"),
    ),
}
"""The levers of `streaming_space`."""


def fast_math_allowed(card: OperatorCard) -> bool:
    """Whether every output's tolerance admits fast intrinsics (see FAST_MATH_MIN_RTOL)."""
    return all(out.effective_tolerance().rtol >= FAST_MATH_MIN_RTOL for out in card.outputs)


class TemplateParams(BaseModel):
    """One template's parameters, typed: frozen, strict (no "4" for 4, no True for 1), no field unknown to it.
    Fields are declared in the order of the template's space; one a card's space lacks is None (left out of
    `as_dict`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def as_dict(self) -> Params:
        """The canonical serialisation: the fields in their declared order, those left out (None) not there."""
        return self.model_dump(exclude_none=True)

    def but(self, **changes: ParamValue) -> Self:
        """A copy with some values changed, validated as the model is."""
        return self.model_validate({**self.as_dict(), **changes})


P = TypeVar("P", bound=TemplateParams)


class Template(ABC, Generic[P]):
    """One parameterised kernel family: its space, its validity rules, and its renderer, over its typed params P."""

    name: ClassVar[str]
    """The template's name in a candidate's identity (never changed once runs hold it)."""
    version: ClassVar[int] = 1
    """The version of its renders: bumped with every change to a render of the same params (the golden render test
    refuses a changed render under the old version), so a run's candidates of the old renders stay themselves."""
    families: tuple[str, ...] = ()
    entry = "kf_kernel"
    levers: ClassVar[Levers] = WELL_KNOWN_LEVERS
    """Which parameters address each bottleneck class: the proposer tries moves along them first for a parent
    profiled in that class (levers of parameters a card's space lacks are ignored)."""

    @abstractmethod
    def unsupported(self, card: OperatorCard) -> str | None:
        """Why this template cannot serve the card at all (tensor names, dtypes), or None."""

    @abstractmethod
    def space(self, card: OperatorCard) -> Space:
        """Every parameter and its values, in an order where neighbours are small steps."""

    @abstractmethod
    def params_type(self, card: OperatorCard) -> type[P]:
        """The model of the card's params (a template whose space differs by card may have several)."""

    @abstractmethod
    def problem(self, card: OperatorCard, params: P) -> str | None:
        """Why these (canonical) params would be wrong or unlaunchable for the card, or None."""

    @abstractmethod
    def render(self, card: OperatorCard, params: P) -> tuple[str, LaunchPlan]:
        """Source and plan for valid params."""

    @abstractmethod
    def seed_params(self, card: OperatorCard) -> list[Params]:
        """Diverse starting points (different strategies); invalid ones are dropped by the caller."""

    def canonical(self, card: OperatorCard, params: P) -> P:
        """The params with values that do not matter for the chosen strategy fixed, so twins compare equal."""
        return params

    def typed(self, card: OperatorCard, params: Mapping[str, ParamValue]) -> P | None:
        """The params as the card's model when they belong to the card's space (every parameter, each a value of
        its own), else None."""
        space = self.space(card)
        if set(params) != set(space) or any(params[k] not in values for k, values in space.items()):
            return None
        try:
            return self.params_type(card).model_validate({k: params[k] for k in space})
        except ValidationError:  # a value equal to one of the space's but of another type (True for 1)
            return None

    def valid(self, card: OperatorCard, params: Mapping[str, ParamValue]) -> P | None:
        """The canonical form when the params belong to this space and are valid, else None."""
        typed = self.typed(card, params)
        if typed is None:
            return None
        canon = self.canonical(card, typed)
        return canon if self.problem(card, canon) is None else None

    def identity(self, params: P) -> TemplateIdentity:
        """The identity of the candidate these (valid, canonical) params make (vocabulary/identity.py)."""
        return TemplateIdentity(template=self.name, version=self.version, params=params.as_dict())

    def levers_of(self, card: OperatorCard, bottleneck: Bottleneck) -> tuple[Lever, ...]:
        """The levers for the class that the card's space can move (a parameter with two values or more)."""
        space = self.space(card)
        return tuple(lever for lever in self.levers.get(bottleneck, ()) if len(space.get(lever.param, ())) > 1)

    def count_valid(self, card: OperatorCard, cap: int) -> tuple[int, bool]:
        """(distinct valid configurations, whether that is all of them): canonical forms of the first `cap`
        combinations of the space, so a large space costs at most `cap` validity checks."""
        space = self.space(card)
        found: set[tuple[str, ...]] = set()
        for values in itertools.islice(itertools.product(*space.values()), cap):
            canon = self.valid(card, dict(zip(space, values, strict=True)))
            if canon is not None:
                found.add(tuple(str(v) for v in canon.as_dict().values()))
        return len(found), math.prod(len(v) for v in space.values()) <= cap


def describe(params: Mapping[str, ParamValue]) -> str:
    """`block 256, vec 8, storage registers`: params in words for the TUI."""
    return ", ".join(f"{k} {v}" for k, v in params.items())


def changes(old: Mapping[str, ParamValue], new: Mapping[str, ParamValue]) -> str:
    """`block 256 -> 512, vec 4 -> 8`: what a mutation changed."""
    return ", ".join(f"{k} {old.get(k)} -> {new[k]}" for k in new if old.get(k) != new[k])


def naming_problem(
    card: OperatorCard, inputs: Sequence[str], outputs: Sequence[str], sizes: Sequence[str]
) -> str | None:
    """Why the card does not follow a template's tensor and size naming convention, or None."""
    have_in = [t.name for t in card.inputs]
    have_out = [t.name for t in card.outputs]
    if have_in != list(inputs) or have_out != list(outputs):
        return f"expects inputs {list(inputs)} and outputs {list(outputs)}, card has {have_in} -> {have_out}"
    missing = [s for s in sizes if s not in card.sizes]
    if missing:
        return f"card lacks sizes {missing}"
    dtypes = {t.dtype for t in [*card.inputs, *card.outputs]}
    if len(dtypes) != 1 or not dtypes <= set(C_TYPE):
        return f"expects one dtype among {sorted(C_TYPE)}, card has {sorted(dtypes)}"
    return None


def dtype_of(card: OperatorCard) -> str:
    return card.outputs[0].dtype


def dtypes_problem(card: OperatorCard, allowed: Collection[str], what: str) -> str | None:
    """Why the card's tensors are not all of one dtype among `allowed` (`what` takes them: "tensor cores take"), or
    None."""
    dtypes = sorted({t.dtype for t in [*card.inputs, *card.outputs]})
    if len(dtypes) == 1 and dtypes[0] in allowed:
        return None
    return f"{what} one of {sorted(allowed)} here, card has {dtypes}"


def call_scalars(card: OperatorCard, op: str, what: str) -> dict[str, ChainValue | None] | str:
    """What the card's recorded call (`[call]`) passed, by argument path, where it is a call of `op`; else why a
    template cannot read `what` from it."""
    if card.call is None or card.call.op != op:
        return f"the card records no {op.removesuffix('.default')} call ([call]) to read {what} from"
    return {a.path: a.value for a in card.call.args}


def vec_widths(dtype: str) -> tuple[int, ...]:
    """Vector widths (elements) whose access fits one 16-byte load for the dtype."""
    return tuple(v for v in (1, 2, 4, 8) if v * ELEMENT_BYTES[dtype] <= 16)


def prelude_values(dtype: str, vec: int) -> dict[str, Value]:
    """The values cuda/prelude.cuh renders with: the dtype's header, C type and conversions, the vector's width."""
    to_f, from_f = {
        "float32": ("v", "v"),
        "bfloat16": ("__bfloat162float(v)", "__float2bfloat16_rn(v)"),
        "float16": ("__half2float(v)", "__float2half_rn(v)"),
    }[dtype]
    return {
        "is_bf16": dtype == "bfloat16",
        "is_f16": dtype == "float16",
        "c_type": C_TYPE[dtype],
        "vec": vec,
        "vec_bytes": vec * ELEMENT_BYTES[dtype],
        "to_f": to_f,
        "from_f": from_f,
    }


def reduce_values(fast_exp: bool) -> dict[str, Value]:
    """The values cuda/reduce.cuh renders with: the exp the kernel chose (fast __expf or accurate expf)."""
    return {"expf": "__expf" if fast_exp else "expf"}


def streaming_space(card: OperatorCard) -> Space:
    """The space of kernels that stream elements once (elementwise maps, flat copies): vector width, block,
    unroll, grid-stride over waves of the SMs or one chunk per thread, and blocks per SM."""
    return {
        "vec": vec_widths(dtype_of(card)),
        "block": (128, 256, 512, 1024),
        "unroll": (1, 2, 4),
        "loop": ("grid_stride", "one_per_thread"),
        "waves": (1, 2, 4, 8, 16),
        "minb": (1, 2),
    }


class StreamingParams(TemplateParams):
    """The params of `streaming_space`."""

    vec: int
    block: int
    unroll: int
    loop: Literal["grid_stride", "one_per_thread"]
    waves: int
    minb: int


S = TypeVar("S", bound=StreamingParams)


def streaming_canonical(params: S) -> S:
    """waves only matters for grid_stride."""
    return params.but(waves=1) if params.loop == "one_per_thread" else params


def streaming_loop(params: StreamingParams) -> str:
    """The loop in words for the source's header. The waves are said, though they only change the plan's grid, from
    when candidates were told apart by their source; the renders keep them (a change would be a new version)."""
    return f"grid_stride over {params.waves} waves" if params.loop == "grid_stride" else params.loop


def streaming_problem(params: StreamingParams) -> str | None:
    """Launches a streaming kernel cannot make resident: too many threads per SM, or too many waves."""
    if params.minb * params.block > 2048:
        return "minb x block exceeds 2048 threads per SM"
    if params.waves * params.minb * params.block > 16 * 2048:
        return "more than 16 waves of resident threads"
    return None
