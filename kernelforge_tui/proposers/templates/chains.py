"""Fused chains, the cards `kernelforge capture` makes for several aten calls in a row (`capture.patterns`; the card's
[chain] says which calls): one kernel reads the chain's inputs once and writes its output once.

- `ChainRowTemplate` (cuda/chain_rows.cu): a residual add then a norm of the sum (residual_layer_norm: x, r, w, b ->
  y; residual_rms_norm: x, r, w -> y; residual_sum_layer_norm and residual_sum_rms_norm also write the sum s, which
  the model reads again: -> s, y), and a scale and a mask then a softmax (scale_softmax: x -> y; mask_softmax and
  scale_mask_softmax: x, mask -> y, the mask [mask_rows, cols] broadcast over the rows as the card's heads and seq
  say). The rows template's parameters and rules (its strategies, rows per block, vectors, registers or streaming,
  Welford, the online softmax, fast exp), without shared-memory storage.
- `BiasActTemplate` (cuda/bias_act.cu): a bias add along the last axis then an activation (bias_gelu, bias_gelu_tanh,
  bias_silu, bias_relu: x [rows, cols], b [cols] -> y), the elementwise template's parameters and its fast forms; VEC
  divides cols.
- `BatchNormActTemplate` (cuda/batch_norm_act.cu): an eval batch norm, a residual add or not, then an activation
  (batch_norm_relu, batch_norm_add_relu, ...: x, w, b, mean, var[, r] -> y over [n, c, hw] or, channels-last,
  [n, hw, c]), y = act((x - mean) * scale + b [+ r]) with scale = w * rsqrt(var + eps) per channel; the elementwise
  template's parameters, VEC divides the channel's run (hw, or c channels-last).
- `GroupNormActTemplate` (cuda/group_norm_act.cu): a group norm then an activation (group_norm_silu, ...: x [n, c, h,
  w], gamma, beta [c] -> y), a block per (sample, group), the group kept in shared memory or read again.

SwiGLU's silu_mul and the decomposed rms_norm are chains the single-op templates already compute (elementwise,
rows). The eps and the scale are the card's (its chain's scalars); where the card's reference keeps intermediate
results in the card's dtype as eager does (`Chain.rounded`), so do the kernels. These templates come first in the
library: a chain card must never go to a single op's template, which would compute one call of it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from kernelforge_tui.capture.families import FINFO_EPS
from kernelforge_tui.capture.patterns import BATCH_NORM
from kernelforge_tui.cards.chain import Chain
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    ELEMENT_BYTES,
    MAX_DYNAMIC_SHARED,
    SM_COUNT,
    THREADS_PER_SM,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    naming_problem,
    prelude_values,
    reduce_values,
    streaming_loop,
    vec_widths,
)
from kernelforge_tui.proposers.templates.elementwise import (
    OPS,
    ElementwiseParams,
    ElementwiseTemplate,
    fast_form,
    operation,
)
from kernelforge_tui.proposers.templates.row_reductions import RowParams, RowTemplate
from kernelforge_tui.proposers.templates.source import render

ROW_CHAINS: dict[str, tuple[str, list[str], list[str]]] = {
    "residual_layer_norm": ("layer_norm", ["x", "r", "w", "b"], ["y"]),
    "residual_rms_norm": ("rms_norm", ["x", "r", "w"], ["y"]),
    "residual_sum_layer_norm": ("layer_norm", ["x", "r", "w", "b"], ["s", "y"]),
    "residual_sum_rms_norm": ("rms_norm", ["x", "r", "w"], ["s", "y"]),
    "scale_softmax": ("softmax", ["x"], ["y"]),
    "mask_softmax": ("softmax", ["x", "mask"], ["y"]),
    "scale_mask_softmax": ("softmax", ["x", "mask"], ["y"]),
}
"""Pattern -> (the card's family, its inputs, its outputs: y, and the residual sum s where the model reads it too)."""
SHARED_PER_SM = 228 * 1024


def _float_literal(value: float) -> str:
    """A C float literal for a captured scalar (repr is exact for the double; the f suffix rounds it to fp32, as
    torch's fp32 math takes it)."""
    return f"{float(value)!r}f"


def chain_problem(card: OperatorCard, patterns: tuple[str, ...]) -> tuple[Chain, str] | str:
    """The card's chain and pattern when it is one of `patterns`, else why not."""
    chain = card.chain
    if chain is None:
        return "not a fused chain's card (no [chain])"
    if chain.pattern not in patterns:
        return f"its chain {chain.pattern} is not one of this template's ({', '.join(patterns)})"
    return chain, chain.pattern


def norm_eps(chain: Chain, dtype: str) -> float | None:
    """The eps of the chain's norm, as its call passed it (None there: the dtype's finfo eps, as rms_norm takes)."""
    for op, path in (
        ("aten.native_layer_norm.default", "args[4]"),
        ("aten.native_group_norm.default", "args[7]"),
        *((op, f"args[{eps_at}]") for op, (_, eps_at) in BATCH_NORM.items()),
        ("aten._fused_rms_norm.default", "args[3]"),
        ("aten.rms_norm.default", "args[3]"),
        ("aten.rms_norm.default", "kwargs.eps"),
    ):
        if any(s.op == op for s in chain.steps):
            value = chain.value(op, path)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if path.startswith("kwargs") or op != "aten.rms_norm.default":
                return FINFO_EPS[dtype]
    after_mean = [k + 1 for k, s in enumerate(chain.steps[:-1]) if s.op == "aten.mean.dim"]  # decomposed rms_norm
    for k in after_mean:
        value = next((a.value for a in chain.steps[k].args if a.path == "args[1]" and a.kind == "scalar"), None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def chain_scale(chain: Chain) -> tuple[str, float] | None:
    """("*", s) or ("/", s) where the chain starts with x * s or x / s, else None."""
    first = chain.steps[0]
    value = next((a.value for a in first.args if a.path == "args[1]" and a.kind == "scalar"), None)
    if first.op in ("aten.mul.Tensor", "aten.div.Tensor") and isinstance(value, (int, float)):
        return ("*" if first.op == "aten.mul.Tensor" else "/", float(value))
    return None


class ChainRowTemplate(RowTemplate):
    """The rows template's parameters and rules over chain_rows.cu."""

    name = "chain_rows"
    version = 2  # its own renders' version, not the rows template's (2: the residual sum written out, `writes_sum`)

    def unsupported(self, card: OperatorCard) -> str | None:
        found = chain_problem(card, tuple(ROW_CHAINS))
        if isinstance(found, str):
            return found
        chain, pattern = found
        family, inputs, outputs = ROW_CHAINS[pattern]
        if card.family != family:
            return f"a {pattern} chain is a {family} card, not {card.family}"
        sizes = ["rows", "cols", *(["heads", "seq"] if "mask" in inputs else [])]
        problem = naming_problem(card, inputs, outputs, sizes)
        if problem is None and family != "softmax" and norm_eps(chain, dtype_of(card)) is None:
            problem = "the chain's norm passes no eps this template can read"
        return problem

    def space(self, card: OperatorCard) -> Space:
        return {**super().space(card), "storage": ("registers", "stream")}

    def seed_params(self, card: OperatorCard) -> list[Params]:
        return [seed for seed in super().seed_params(card) if seed["storage"] != "smem"]

    def render(self, card: OperatorCard, params: RowParams) -> tuple[str, LaunchPlan]:
        chain = card.chain
        assert chain is not None
        family, inputs, outputs = ROW_CHAINS[chain.pattern]
        dtype = dtype_of(card)
        tpr = params.block // params.rpb
        items = -(-(card.sizes["cols"] // params.vec) // tpr)
        scale = chain_scale(chain)
        eps = norm_eps(chain, dtype) if family != "softmax" else None
        masked = "mask" in inputs
        what = {
            "residual_layer_norm": "layer_norm of x + r",
            "residual_rms_norm": "rms_norm of x + r",
            "residual_sum_layer_norm": "x + r written as s, and its layer_norm",
            "residual_sum_rms_norm": "x + r written as s, and its rms_norm",
            "scale_softmax": "softmax of x {op} s",
            "mask_softmax": "softmax of x + mask",
            "scale_mask_softmax": "softmax of x {op} s + mask",
        }[chain.pattern].format(op=scale[0] if scale else "")
        if eps is not None:
            what += f", eps {eps!r}"
        if scale is not None:
            what += f", s {scale[1]!r}"
        if chain.rounded:
            what += ", the prologue rounded to the dtype as eager stores it"
        pointers = [*(f"const T* __restrict__ {name}" for name in inputs), *(f"T* __restrict__ {n}" for n in outputs)]
        signature = ", ".join([*pointers, "int rows", "int cols"])
        source = render(
            "chain_rows.cu",
            **prelude_values(dtype, params.vec),
            **reduce_values(params.fast_exp != 0),  # a family without the parameter uses no exp
            what=what,
            dtype=dtype,
            tpr=tpr,
            rpb=params.rpb,
            items=items,
            registers=int(params.storage == "registers"),
            storage=params.storage,
            eps=_float_literal(eps) if eps is not None else "",
            scaled=scale is not None,
            scale_op=scale[0] if scale else "*",
            scale=_float_literal(scale[1]) if scale else "",
            masked=masked,
            heads_seq=card.sizes.get("heads", 1) * card.sizes.get("seq", 1),
            seq=card.sizes.get("seq", 1),
            residual=family != "softmax",
            writes_sum="s" in outputs,
            unpaired=family == "softmax" and not masked,
            layer=family == "layer_norm",
            welford=bool(params.welford),
            rms=family == "rms_norm",
            softmax=family == "softmax",
            online=bool(params.online),
            rounded=chain.rounded,
            block=params.block,
            minb=params.minb,
            entry=f"kf_{chain.pattern}",
            signature=signature,
        )
        plan = LaunchPlan(
            entry=f"kf_{chain.pattern}",
            grid=[f"cdiv(rows, {params.rpb})"],
            block=[params.block],
            args=[*inputs, *outputs, "rows", "cols"],
        )
        return source, plan


BIAS_CHAINS = ("bias_gelu", "bias_gelu_tanh", "bias_silu", "bias_relu")


class BiasActTemplate(ElementwiseTemplate):
    """The elementwise template's parameters, rules and fast forms over bias_act.cu."""

    name = "bias_act"
    entry = "kf_bias_act"

    def unsupported(self, card: OperatorCard) -> str | None:
        found = chain_problem(card, BIAS_CHAINS)
        if isinstance(found, str):
            return found
        return naming_problem(card, ["x", "b"], ["y"], ["rows", "cols"])

    def problem(self, card: OperatorCard, params: ElementwiseParams) -> str | None:
        if card.sizes["cols"] % params.vec:
            return f"vec {params.vec} does not divide cols {card.sizes['cols']} (a chunk would take two rows' bias)"
        return super().problem(card, params)

    def render(self, card: OperatorCard, params: ElementwiseParams) -> tuple[str, LaunchPlan]:
        chain = card.chain
        op = operation(card)
        assert chain is not None and op is not None
        form = fast_form(card) if params.fast_math else None
        dtype = dtype_of(card)
        vec, block, unroll = params.vec, params.block, params.unroll
        grid_stride = params.loop == "grid_stride"
        source = render(
            "bias_act.cu",
            **prelude_values(dtype, vec),
            what=f"{op}(x + b) with b along the last axis ({dtype}{', fast math' if form else ''}"
            + (", the sum rounded to the dtype as eager stores it)" if chain.rounded else ")"),
            block=block,
            unroll=unroll,
            loop=streaming_loop(params),
            col_chunks=card.sizes["cols"] // vec,
            helpers=render(form.helpers) if form and form.helpers else "",
            expression=form.expression if form else OPS[op][1],
            grid_stride=grid_stride,
            rounded=chain.rounded,
            minb=params.minb,
        )
        chunks = f"cdiv(rows * cols, {block * vec * unroll})"
        grid = f"min({chunks}, {SM_COUNT * params.waves * params.minb})" if grid_stride else chunks
        plan = LaunchPlan(entry=self.entry, grid=[grid], block=[block], args=["x", "b", "y", "rows * cols:i64"])
        return source, plan


BATCH_NORM_CHAINS = tuple(
    f"batch_norm_{add}{act}" for add in ("", "add_") for act in ("gelu", "gelu_tanh", "silu", "relu")
)


class BatchNormActTemplate(ElementwiseTemplate):
    """The elementwise template's parameters, rules and fast forms over batch_norm_act.cu."""

    name = "batch_norm_act"
    entry = "kf_batch_norm_act"

    def unsupported(self, card: OperatorCard) -> str | None:
        found = chain_problem(card, BATCH_NORM_CHAINS)
        if isinstance(found, str):
            return found
        chain, pattern = found
        inputs = ["x", "w", "b", "mean", "var", *(["r"] if "_add_" in pattern else [])]
        problem = naming_problem(card, inputs, ["y"], ["n", "c", "hw"])
        if problem is None and norm_eps(chain, dtype_of(card)) is None:
            problem = "the chain's batch norm passes no eps this template can read"
        return problem

    def _per_channel(self, card: OperatorCard) -> int:
        """Elements of one channel between two others in memory: 1 channels-last, hw in NCHW."""
        return 1 if card.tensor("x").shape[-1] == "c" else card.sizes["hw"]

    def problem(self, card: OperatorCard, params: ElementwiseParams) -> str | None:
        inner = self._per_channel(card)
        span, what = (card.sizes["c"], "c") if inner == 1 else (inner, "hw")
        if span % params.vec:
            return f"vec {params.vec} does not divide {what} = {span} (a chunk would span two channels)"
        return super().problem(card, params)

    def render(self, card: OperatorCard, params: ElementwiseParams) -> tuple[str, LaunchPlan]:
        chain = card.chain
        op = operation(card)
        assert chain is not None and op is not None
        dtype = dtype_of(card)
        eps = norm_eps(chain, dtype)
        assert eps is not None
        form = fast_form(card) if params.fast_math else None
        vec, block, unroll = params.vec, params.block, params.unroll
        grid_stride = params.loop == "grid_stride"
        inner = self._per_channel(card)
        residual = "_add_" in chain.pattern
        inputs = ["x", "w", "b", "mean", "var", *(["r"] if residual else [])]
        signature = ", ".join([*(f"const T* __restrict__ {t}" for t in inputs), "T* __restrict__ y", "long long n"])
        layout = "channels-last" if inner == 1 else "NCHW"
        source = render(
            "batch_norm_act.cu",
            **prelude_values(dtype, vec),
            what=f"{op}(batch_norm(x){' + r' if residual else ''}), {layout}, eps {eps!r} ({dtype}"
            + (", fast math" if form else "")
            + (", each result rounded to the dtype as eager stores it)" if chain.rounded else ")"),
            block=block,
            unroll=unroll,
            loop=streaming_loop(params),
            channels=card.sizes["c"],
            per_channel=inner // vec if inner > 1 else 1,
            eps=_float_literal(eps),
            helpers=render(form.helpers) if form and form.helpers else "",
            expression=form.expression if form else OPS[op][1],
            channels_last=inner == 1,
            residual=residual,
            grid_stride=grid_stride,
            rounded=chain.rounded,
            minb=params.minb,
            signature=signature,
        )
        chunks = f"cdiv(n * c * hw, {block * vec * unroll})"
        grid = f"min({chunks}, {SM_COUNT * params.waves * params.minb})" if grid_stride else chunks
        plan = LaunchPlan(entry=self.entry, grid=[grid], block=[block], args=[*inputs, "y", "n * c * hw:i64"])
        return source, plan


GROUP_NORM_CHAINS = ("group_norm_gelu", "group_norm_gelu_tanh", "group_norm_silu", "group_norm_relu")


class GroupNormActParams(TemplateParams):
    block: int
    vec: int
    storage: Literal["smem", "stream"]
    minb: int


class GroupNormActTemplate(Template[GroupNormActParams]):
    """A block per (sample, group) over group_norm_act.cu."""

    name = "group_norm_act"
    families = ("group_norm",)
    entry = "kf_group_norm_act"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (Lever("storage", "down", "x read once"), Lever("vec", "up", "wider accesses")),
        "memory_latency": (Lever("minb", "up", "more resident blocks"), Lever("block", "any", "block size")),
        "compute": (Lever("vec", "up", "fewer instructions per element"),),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        found = chain_problem(card, GROUP_NORM_CHAINS)
        if isinstance(found, str):
            return found
        chain, pattern = found
        problem = naming_problem(card, ["x", "gamma", "beta"], ["y"], ["n", "c", "h", "w", "groups"])
        if problem is None and card.sizes["c"] % card.sizes["groups"]:
            problem = f"c {card.sizes['c']} is not a multiple of groups {card.sizes['groups']}"
        if problem is None and norm_eps(chain, dtype_of(card)) is None:
            problem = "the chain's group norm passes no eps this template can read"
        if problem is None and pattern.removeprefix("group_norm_") not in OPS:
            problem = f"no activation {pattern.removeprefix('group_norm_')} in the elementwise table"
        return problem

    def params_type(self, card: OperatorCard) -> type[GroupNormActParams]:
        return GroupNormActParams

    def space(self, card: OperatorCard) -> Space:
        return {
            "block": (32, 64, 128, 256, 512, 1024),
            "vec": vec_widths(dtype_of(card)),
            "storage": ("smem", "stream"),
            "minb": (1, 2),
        }

    def _span(self, card: OperatorCard) -> int:
        s = card.sizes
        return s["c"] // s["groups"] * s["h"] * s["w"]

    def problem(self, card: OperatorCard, params: GroupNormActParams) -> str | None:
        hw = card.sizes["h"] * card.sizes["w"]
        if hw % params.vec:
            return f"vec {params.vec} does not divide h * w = {hw} (a chunk would span two channels)"
        if params.minb * params.block > THREADS_PER_SM:
            return f"minb {params.minb} x block {params.block} exceeds {THREADS_PER_SM} threads per SM"
        chunks = self._span(card) // params.vec
        if params.block > max(32, chunks):
            return f"block {params.block} for {chunks} chunks a group leaves threads idle"
        group_bytes = self._span(card) * ELEMENT_BYTES[dtype_of(card)]
        if params.storage == "smem" and group_bytes > MAX_DYNAMIC_SHARED:
            return f"a group of {group_bytes} bytes does not fit in shared memory"
        if params.storage == "smem" and params.minb * (group_bytes + 1024) > SHARED_PER_SM:
            return f"{params.minb} groups of {group_bytes} bytes do not fit in one SM's shared memory"
        return None

    def render(self, card: OperatorCard, params: GroupNormActParams) -> tuple[str, LaunchPlan]:
        chain = card.chain
        assert chain is not None
        act = chain.pattern.removeprefix("group_norm_")
        dtype = dtype_of(card)
        eps = norm_eps(chain, dtype)
        assert eps is not None
        span = self._span(card)
        smem = params.storage == "smem"
        source = render(
            "group_norm_act.cu",
            **prelude_values(dtype, params.vec),
            **reduce_values(False),
            what=f"{act}(group_norm(x)), eps {eps!r}"
            + (", the norm rounded to the dtype as eager stores it" if chain.rounded else ""),
            dtype=dtype,
            block=params.block,
            storage="kept in shared memory" if smem else "read again from memory",
            span=span,
            hw=card.sizes["h"] * card.sizes["w"],
            per_group=card.sizes["c"] // card.sizes["groups"],
            groups=card.sizes["groups"],
            eps=_float_literal(eps),
            smem=int(smem),
            expression=OPS[act][1],
            rounded=chain.rounded,
            minb=params.minb,
        )
        shared = span * ELEMENT_BYTES[dtype] if smem else 0
        plan = LaunchPlan(
            entry=self.entry,
            grid=["n * groups"],
            block=[params.block],
            shared_bytes=shared,
            args=["x", "gamma", "beta", "y"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        vec = max(v for v in vec_widths(dtype_of(card)) if (card.sizes["h"] * card.sizes["w"]) % v == 0)
        return [
            {"block": 1024, "vec": vec, "storage": "smem", "minb": 1},
            {"block": 512, "vec": vec, "storage": "smem", "minb": 2},
            {"block": 256, "vec": vec, "storage": "smem", "minb": 1},
            {"block": 1024, "vec": vec, "storage": "stream", "minb": 1},
            {"block": 256, "vec": 1, "storage": "stream", "minb": 2},
        ]


CHAIN_TEMPLATES: tuple[Template[Any], ...] = (
    ChainRowTemplate(),
    BiasActTemplate(),
    BatchNormActTemplate(),
    GroupNormActTemplate(),
)
"""The library's chain templates, to be asked before the single-op templates (module docstring)."""
