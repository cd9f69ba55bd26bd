"""Baseline kernels for captured cards: one straightforward, correct CUDA kernel per family and dtype.

Why these and not the template library's seeds: a card's baseline is what every speedup is measured against and what
proves a card can run at all, so it must be plainly right (fp32 math, the op's own eps baked in, NaN and inf
propagating as torch's do, any size) rather than fast. They are not deliberately slow either: the rows families use a
block per row with a shared-memory tree reduction, so that timing the baseline beside every candidate does not eat
the search's GPU budget on large captured shapes (a thread per row over a 1024-wide row is milliseconds).

The kernels are the files cuda/*.cu (cuda/prelude.cuh and block_reduce.cuh are shared, with the suite's baselines
too). Each function returns (source, plan) for a card whose tensors follow the family's naming (`families.py` makes
them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cuda_files import CudaFiles, Value

CUDA = CudaFiles(__package__)
BLOCK = 256
DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes a baseline exists for (one dtype for every tensor of a card)."""

ELEMENTWISE = {
    "add": (2, "a0 + a1"),
    "sub": (2, "a0 - a1"),
    "mul": (2, "a0 * a1"),
    "silu_mul": (2, "a0 / (1.0f + expf(-a0)) * a1"),
    "silu": (1, "a0 / (1.0f + expf(-a0))"),
    "relu": (1, "(a0 > 0.0f || a0 != a0) ? a0 : 0.0f"),
    "gelu": (1, "0.5f * a0 * (1.0f + erff(a0 * 0.70710678118654752f))"),
    "gelu_tanh": (1, "0.5f * a0 * (1.0f + tanhf(0.79788456080286536f * (a0 + 0.044715f * a0 * a0 * a0)))"),
}
"""Op name -> (arity, fp32 expression over a0, a1). relu keeps NaN as torch.relu does (fmaxf would make it 0)."""


def prelude_values(dtype: str, what: str, author: str = "`kernelforge capture`") -> dict[str, Value]:
    """The values cuda/prelude.cuh renders with: the dtype, and what the kernel is and who writes it (its comment)."""
    if dtype not in DTYPES:
        raise ValueError(f"no baseline for dtype {dtype}: one of {', '.join(DTYPES)}")
    flags = {"is_f32": dtype == "float32", "is_bf16": dtype == "bfloat16", "is_f16": dtype == "float16"}
    return {**flags, "dtype": dtype, "what": what, "author": author, "block": BLOCK}


def prelude(dtype: str, what: str, author: str = "`kernelforge capture`") -> str:
    """`T`, `ld` (to fp32) and `cv` (from fp32) for one dtype, under a comment saying what the kernel is."""
    return CUDA.render("prelude.cuh", **prelude_values(dtype, what, author))


def eps_literal(eps: float) -> str:
    """A C float literal for eps (repr is exact for the double; the f suffix rounds it as torch's fp32 math does)."""
    text = repr(float(eps))
    return text + ("f" if ("." in text or "e" in text) else ".0f")


def elementwise(op: str, dtype: str, inputs: list[str], output: str, count: str) -> tuple[str, LaunchPlan]:
    """y = op(a[, b]) element by element, one thread per element."""
    arity, expression = ELEMENTWISE[op]
    if len(inputs) != arity:
        raise ValueError(f"{op} takes {arity} operand(s), not {len(inputs)}: {inputs}")
    names = dict(zip(("in0", "in1"), inputs, strict=False))
    values = prelude_values(dtype, f"{op}, one thread per element")
    source = CUDA.render(
        "elementwise.cu",
        **values,
        **names,
        output=output,
        binary=arity == 2,
        bias=False,
        rounded=False,
        expression=expression,
    )
    plan = LaunchPlan(
        entry="kf_capture_elementwise",
        grid=[f"cdiv({count}, {BLOCK})"],
        block=[BLOCK],
        args=[*inputs, output, f"{count}:i64"],
    )
    return source, plan


def _activation(act: str) -> str:
    """The fp32 expression over a0 of a one-operand op of ELEMENTWISE."""
    arity, expression = ELEMENTWISE[act]
    if arity != 1:
        raise ValueError(f"{act} is not an activation (it takes {arity} operands)")
    return expression


def bias_act(act: str, dtype: str, rounded: bool = False) -> tuple[str, LaunchPlan]:
    """y = act(x + b) of x[rows, cols] and a bias b[cols] along its last axis, one thread per element (a fused
    chain's bias add and activation, the sum kept in fp32; `rounded`: in the dtype, as eager stores it)."""
    values = prelude_values(dtype, f"{act}(x + b) with b along the last axis, one thread per element")
    source = CUDA.render(
        "elementwise.cu",
        **values,
        in0="x",
        in1="b",
        output="y",
        binary=False,
        bias=True,
        rounded=rounded,
        expression=_activation(act),
    )
    plan = LaunchPlan(
        entry="kf_capture_elementwise",
        grid=[f"cdiv(rows * cols, {BLOCK})"],
        block=[BLOCK],
        args=["x", "b", "y", "rows * cols:i64", "cols"],
    )
    return source, plan


def softmax(
    dtype: str, scale: tuple[str, float] | None = None, masked: bool = False, rounded: bool = False
) -> tuple[str, LaunchPlan]:
    """y = softmax(x) over the rows of x[rows, cols]: a block per row, max, sum of exp, write. A fused chain's
    softmax of x * s (`scale` ("*", s)) or x / s (("/", s)) and, `masked`, plus mask[mask_rows, cols] broadcast over
    the rows as [batch, 1, seq, cols] over [batch, heads, seq, cols] (the card's sizes heads and seq), the logits
    kept in fp32 (`rounded`: each in the dtype, as eager stores them)."""
    fused = scale is not None or masked
    op, value = scale or ("*", 1.0)
    logits = "x" + (f" {op} {value!r}" if scale is not None else "") + (" + mask" if masked else "")
    what = (
        f"softmax of {logits} over the last axis, a block per row"
        if fused
        else "softmax over the last axis, a block per row"
    )
    source = CUDA.render(
        "softmax.cu",
        **prelude_values(dtype, what),
        fused=fused,
        scaled=scale is not None,
        masked=masked,
        rounded=rounded,
        scale_op=op,
        scale=eps_literal(value),
    )
    args = ["x", "mask", "y", "rows", "cols", "heads * seq", "seq"] if masked else ["x", "y", "rows", "cols"]
    return source, LaunchPlan(entry="kf_capture_softmax", grid=["rows"], block=[BLOCK], args=args)


def rms_norm(
    dtype: str, eps: float, residual: bool = False, rounded: bool = False, kept: bool = False
) -> tuple[str, LaunchPlan]:
    """y = x * rsqrt(mean(x^2) + eps) * w over the rows of x[rows, cols], w[cols]; `residual` (a fused chain's): of
    x + r, the sum kept in fp32 (`rounded`: in the dtype, as eager stores it), written out as s too with `kept`."""
    what = f"rms_norm{' of x + r' if residual else ''} over the last axis, eps {eps!r}, a block per row"
    values = prelude_values(dtype, what)
    source = CUDA.render("rms_norm.cu", **values, eps=eps_literal(eps), residual=residual, rounded=rounded, kept=kept)
    args = ["x", *(["r"] if residual else []), "w", *(["s"] if kept else []), "y", "rows", "cols"]
    return source, LaunchPlan(entry="kf_capture_rms_norm", grid=["rows"], block=[BLOCK], args=args)


def layer_norm(
    dtype: str, eps: float, residual: bool = False, rounded: bool = False, kept: bool = False
) -> tuple[str, LaunchPlan]:
    """y = (x - mean) * rsqrt(var + eps) * w + b over the rows of x[rows, cols] (two passes: no cancellation);
    `residual` (a fused chain's): of x + r, the sum kept in fp32 (`rounded`: in the dtype, as eager stores it),
    written out as s too with `kept`."""
    what = (
        f"layer_norm{' of x + r' if residual else ''} over the last axis, eps {eps!r}, a block per row, two-pass "
        "variance"
    )
    values = prelude_values(dtype, what)
    source = CUDA.render("layer_norm.cu", **values, eps=eps_literal(eps), residual=residual, rounded=rounded, kept=kept)
    args = ["x", *(["r"] if residual else []), "w", "b", *(["s"] if kept else []), "y", "rows", "cols"]
    return source, LaunchPlan(entry="kf_capture_layer_norm", grid=["rows"], block=[BLOCK], args=args)


def group_norm(dtype: str, eps: float, act: str | None = None, rounded: bool = False) -> tuple[str, LaunchPlan]:
    """y = (x - mean) * rstd * gamma[c] + beta[c] with statistics per (sample, group) of x[n, c, h, w], and the
    statistics mean and rstd [n, groups] (aten.native_group_norm returns them beside y); with `act` (a fused chain's
    activation after the norm, whose statistics nothing reads), y = act of that and no statistics (`rounded`: of
    the normalised value in the dtype, as eager stores it)."""
    what = (
        f"group_norm over NCHW, eps {eps!r}, a block per (sample, group), two-pass variance of x shifted by the"
        " group's first element (a constant group then gives x - mean = 0 exactly, as the reference does)"
    )
    values = prelude_values(dtype, what if act is None else f"{act} of the {what}")
    expression = "" if act is None else _activation(act)
    source = CUDA.render(
        "group_norm.cu", **values, eps=eps_literal(eps), act=act is not None, rounded=rounded, expression=expression
    )
    statistics = ["mean", "rstd"] if act is None else []
    plan = LaunchPlan(
        entry="kf_capture_group_norm",
        grid=["n * groups"],
        block=[BLOCK],
        args=["x", "gamma", "beta", "y", *statistics, "c", "h * w", "groups"],
    )
    return source, plan


def pooling(dtype: str) -> tuple[str, LaunchPlan]:
    """y[n, c] = mean of the plane x[n, c, :, :]: a thread per plane, fp32 sum."""
    source = CUDA.render("avg_pool.cu", **prelude_values(dtype, "adaptive average pooling to 1x1, a thread per plane"))
    grid = [f"cdiv(n * c, {BLOCK})"]
    plan = LaunchPlan(entry="kf_capture_avg_pool", grid=grid, block=[BLOCK], args=["x", "y", "n * c:i64", "h * w"])
    return source, plan


@dataclass(frozen=True)
class NormAct:
    """A fused chain after a batch norm (`families._batch_norm_act`): a residual add, then an activation."""

    act: str
    """An activation of ELEMENTWISE."""
    residual: bool
    channels_last: bool
    """The tensors lie in memory as [n, hw, c] (the channel innermost), else [n, c, hw]."""
    rounded: bool
    """Each result as eager stores it, in the dtype (the card's reference's `rounded`)."""


def batch_norm(dtype: str, eps: float, chain: NormAct | None = None) -> tuple[str, LaunchPlan]:
    """Inference batch norm: y = (x - mean[c]) * rsqrt(var[c] + eps) * w[c] + b[c] over x[n, c, hw]; with `chain`,
    y = act(that [+ r]) over x as it lies in memory (channels-last: [n, hw, c])."""
    what = f"batch_norm in eval mode (running statistics), eps {eps!r}, a thread per element"
    if chain is not None:
        layout = "channels-last" if chain.channels_last else "NCHW"
        what = f"{chain.act}(batch_norm(x){' + r' if chain.residual else ''}), {layout}: " + what
    source = CUDA.render(
        "batch_norm.cu",
        **prelude_values(dtype, what),
        eps=eps_literal(eps),
        chained=chain is not None,
        residual=chain is not None and chain.residual,
        rounded=chain is not None and chain.rounded,
        expression=_activation(chain.act) if chain else "",
    )
    tensors = ["x", "w", "b", "mean", "var", *(["r"] if chain and chain.residual else []), "y"]
    inner = "1" if chain is not None and chain.channels_last else "hw"  # elements between two channels
    plan = LaunchPlan(
        entry="kf_capture_batch_norm",
        grid=[f"cdiv(n * c * hw, {BLOCK})"],
        block=[BLOCK],
        args=[*tensors, "n * c * hw:i64", "c", inner],
    )
    return source, plan


@dataclass(frozen=True)
class Scaled:
    """baddbmm's y = beta c + alpha a b: its scalars, and where c's element (batch, row, col) is (`offset`)."""

    beta: float
    alpha: float
    c_at: str


def matmul(
    dtype: str,
    a_row_major: bool,
    b_row_major: bool,
    bias: bool,
    batched: bool,
    act: str | None = None,
    rounded: bool = False,
    scaled: Scaled | None = None,
) -> tuple[str, LaunchPlan]:
    """y = [act](a b (+ bias[n])) of a[(batch,) M, K] (or its transposed view, held [K, M]) and b[(batch,) K, N] (or
    [N, K]), a 16x16 tile of y a block through shared tiles, fp32 sums: any size and layout the capture keeps. A
    chain's activation sees the sum in fp32 (`rounded`: in the dtype, as eager stores it). `scaled` (baddbmm):
    y = beta c + alpha a b instead, c unread where beta is 0 (as torch leaves it)."""
    layouts = f"a {'[M, K]' if a_row_major else '[K, M]'}, b {'[K, N]' if b_row_major else '[N, K]'}"
    product = f"a b{' + bias' if bias else ''}"
    if scaled is not None:
        product = f"{scaled.beta!r} c + {scaled.alpha!r} a b"
    what = f"y = {f'{act}({product})' if act else product} ({layouts}), a 16x16 shared tile a block"
    source = CUDA.render(
        "matmul.cu",
        **prelude_values(dtype, what),
        a_row_major=int(a_row_major),
        b_row_major=int(b_row_major),
        bias=bias,
        scaled=scaled is not None,
        plain=not bias and scaled is None,
        beta=eps_literal(scaled.beta) if scaled else "",
        alpha=eps_literal(scaled.alpha) if scaled else "",
        c_at=scaled.c_at if scaled else "",
        rounded=rounded,
        expression=_activation(act) if act else "a0",
    )
    plan = LaunchPlan(
        entry="kf_capture_matmul",
        grid=["cdiv(N, 16)", "cdiv(M, 16)", "batch" if batched else 1],
        block=[16, 16],
        args=["a", "b", *(["bias"] if bias else []), *(["c"] if scaled else []), "y", "M", "N", "K"],
    )
    return source, plan


def offset(order: tuple[int, ...], params: tuple[str, ...], extents: tuple[str, ...]) -> str:
    """The C offset of element `params` of a dense tensor whose dims `extents` lie in memory in `order` (outermost
    first; empty: row-major), in 64 bits: how a baseline reads a tensor in the layout the model gave it."""
    dims = order or tuple(range(len(params)))
    text = f"(long long)({params[dims[0]]})"
    for d in dims[1:]:
        text = f"({text} * ({extents[d]}) + ({params[d]}))"
    return text


def layouts(orders: dict[str, tuple[int, ...]]) -> str:
    """How each tensor lies in memory, in words: row-major, channels-last, or its dims in memory order."""
    words = {(): "row-major", (0, 2, 3, 1): "channels-last", (0, 2, 1): "channels-last"}
    return ", ".join(f"{name} {words.get(order, f'dims in memory {list(order)}')}" for name, order in orders.items())


@dataclass(frozen=True)
class Convolution:
    """A captured convolution's scalars and its tensors' memory orders (`families._convolution`)."""

    spatial: int
    """1 or 2."""
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    """Each (h, w); a 1-d convolution's h parts are stride 1, padding 0, dilation 1."""
    groups: int
    bias: bool
    orders: dict[str, tuple[int, ...]]
    """x, weight, y: the dims in memory order (empty: row-major)."""


def convolution(dtype: str, conv: Convolution) -> tuple[str, LaunchPlan]:
    """y = conv(x, weight) (+ bias) of a 1-d or 2-d convolution, a thread per output element, fp32 sums, every tensor
    in its captured layout."""
    logical = {"x": ("n", "c", "h", "w"), "weight": ("o", "c", "h", "w"), "y": ("n", "o", "h", "w")}
    extents = {"x": ("N", "C", "H", "W"), "weight": ("O", "CG", "KH", "KW"), "y": ("N", "O", "OH", "OW")}
    keep = (0, 1, 2, 3) if conv.spatial == 2 else (0, 1, 3)  # a 1-d tensor has no h

    def at(name: str) -> str:
        params, sizes = (tuple(v[d] for d in keep) for v in (logical[name], extents[name]))
        return offset(conv.orders[name], params, sizes)

    what = (
        f"{conv.spatial}-d convolution{' + bias' if conv.bias else ''}, stride {conv.stride}, padding {conv.padding}, "
        f"dilation {conv.dilation}, groups {conv.groups} ({layouts(conv.orders)}), a thread per output element"
    )
    (sh, sw), (ph, pw), (dh, dw) = conv.stride, conv.padding, conv.dilation
    source = CUDA.render(
        "convolution.cu",
        **prelude_values(dtype, what),
        **{"sh": sh, "sw": sw, "ph": ph, "pw": pw, "dh": dh, "dw": dw, "groups": conv.groups},
        x_at=at("x"),
        w_at=at("weight"),
        y_at=at("y"),
        bias=conv.bias,
    )
    h, kh, oh = ("h", "kh", "oh") if conv.spatial == 2 else ("1", "1", "1")
    plan = LaunchPlan(
        entry="kf_capture_convolution",
        grid=[f"cdiv(n * o * {oh} * ow, {BLOCK})"],
        block=[BLOCK],
        args=[
            *["x", "weight", *(["bias"] if conv.bias else []), "y", f"n * o * {oh} * ow:i64"],
            *["c", h, "w", "o", oh, "ow", kh, "kw"],
        ],
    )
    return source, plan


ATTENTION_HEAD_DIM = 256
"""The largest head dim the attention baseline keeps in a warp's registers (8 a lane)."""


def attention(dtype: str, scale: float, causal: bool, orders: dict[str, tuple[int, ...]]) -> tuple[str, LaunchPlan]:
    """y = softmax(scale q k^T [causal]) v of q[batch, heads, sq, d], k[.., sk, d], v[.., sk, dv], a warp per query
    row, an online softmax in fp32, every tensor in its captured layout (`orders`: q, k, v, y, dims in memory
    order)."""
    extents = {"q": "SQ", "k": "SK", "v": "SK", "y": "SQ"}
    width = {"q": "D", "k": "D", "v": "DV", "y": "DV"}
    at = {
        f"{name}_at": offset(orders[name], ("b", "h", "i", "d"), ("B", "H", extents[name], width[name]))
        for name in ("q", "k", "v", "y")
    }
    what = (
        f"scaled dot-product attention{', causal' if causal else ''}, scale {scale!r} ({layouts(orders)}), a warp per "
        "query row, online softmax"
    )
    source = CUDA.render(
        "attention.cu", **prelude_values(dtype, what), scale=eps_literal(scale), causal=int(causal), **at
    )
    plan = LaunchPlan(
        entry="kf_capture_attention",
        grid=["cdiv(batch * heads * sq, 4)"],
        block=[128],
        args=["q", "k", "v", "y", "batch * heads * sq:i64", "heads", "sq", "sk", "d", "dv"],
    )
    return source, plan
