"""Suite tasks over rows and heads: softmax, the norms, attention, rotary embedding, gated activations, top-k.

Each baseline is what a student writes first: a thread per row (softmax, the row norms, top-k, an attention
query), a thread per output element (rope, the gates, merging attention states), or a block per channel with a
shared-memory tree reduction where a channel spans a whole batch (batch norm); loads straight from global memory,
fp32 math, no tiling. Each reference is NumPy in float64 and shares nothing with the baseline.

softmax, layer_norm and rms_norm follow the row template's conventions
(kernelforge_tui/proposers/templates/row_reductions.py: x [rows, cols], w and b [cols], y; eps 1e-5 for layer norm and
1e-6 for rms norm), so the template library serves their cards, and their families run the stress sets
(kernelforge_tui/cards/stress.py): the references give what torch gives there (NaN rows for a NaN, +inf or an all -inf
softmax row, b exactly for a constant layer-norm row).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import EXACT, Distribution, Tolerance
from kernelforge_tui.suite.task import BASELINES, Arrays, Baseline, Precision, Sizes, Task, Tensor, Vendor

ROW = 1024
"""Row length of the row tasks: an LLM hidden size's order, and short enough for a thread per row."""
LAYER_NORM_EPS = 1e-5
RMS_NORM_EPS = 1e-6
"""The row template's eps (templates/row_reductions.py EPS): a card with another eps would not be served by it."""
BATCH_NORM_EPS = 1e-5
NORM_TOLERANCE: dict[Precision, Tolerance] = {
    "float32": Tolerance(rtol=1e-5, atol=1e-5),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-3),
}
"""Centring norms (layer, batch): an output near zero carries the rounding of the mean, an error on the scale of
the inputs (2^-24 of it in fp32 sums, the bf16 rounding of the inputs in bf16), not on its own scale; as the
captured norm cards are checked (capture/families.py)."""
ATTENTION_TOLERANCE: dict[Precision, Tolerance] = {"float32": Tolerance(rtol=1e-5, atol=1e-5)}
"""fp32 attention: an output is a weighted average of values of either sign over seq (or n) keys, so one near zero
carries fp32 rounding of the O(1) terms it averages (dot products of d terms, exp, a sum of seq terms), ~1e-6."""


def _f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def _row_grid(scale: int) -> tuple[int, int]:
    """(rows, cols) of `scale` elements: ROW-wide rows, 256-wide at 2^10 (four rows rather than one)."""
    cols = min(ROW, scale // 4)
    return scale // cols, cols


def _rows_cols(scale: int) -> Sizes:
    rows, cols = _row_grid(scale)
    return {"rows": rows, "cols": cols}


def _softmax_last(s: np.ndarray) -> np.ndarray:
    """softmax over the last axis in float64, max subtracted: an all -inf row is NaN (-inf - -inf), a NaN or +inf
    makes its row NaN, as torch.softmax gives."""
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        normalised: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return normalised


def _silu(a: np.ndarray) -> np.ndarray:
    """a * sigmoid(a) written as torch writes it, a / (1 + exp(-a)): -inf gives NaN (-inf / inf), as torch's."""
    with np.errstate(over="ignore", invalid="ignore"):
        gated: np.ndarray = a / (1.0 + np.exp(-a))
    return gated


def _cast(precision: Precision, **arrays: np.ndarray) -> Arrays:
    return {name: np.ascontiguousarray(array.astype(NUMPY[precision])) for name, array in arrays.items()}


SILU_LARGE = (
    "silu is a / (1 + exp(-a)) in fp32, as torch computes it: for a in (-709, -88.7) exp(-a) overflows fp32 and the "
    "gate is -0, while the float64 gate a * exp(a) is a tiny number that a `large` up value (up to 4e37) lifts "
    "far past any tolerance; neither is wrong for its arithmetic, so no reference can judge both"
)


# softmax -----------------------------------------------------------------------------------------------------------


def _softmax_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    return {"y": _softmax_last(_f64(inputs["x"]))}


SOFTMAX = Task(
    name="softmax",
    family="softmax",
    summary="y = softmax(x) over each row of x[rows, cols]",
    sizes=_rows_cols,
    inputs=(Tensor("x", ("rows", "cols"), distribution=Distribution(std=2.0)),),
    outputs=(Tensor("y", ("rows", "cols")),),
    flops="5 * rows * cols",
    baseline=Baseline(
        source=BASELINES.render("softmax.cu"),
        entry="softmax_naive",
        grid=("cdiv(rows, 256)",),
        block=(256,),
        args=("x", "y", "rows", "cols"),
    ),
    reference=_softmax_reference,
    check="the dtype's tolerance per element; NaN exactly where the reference is NaN (a NaN, +inf or all -inf row)",
    vendor=Vendor("PyTorch (torch.softmax)", lambda torch, t, sizes: {"y": torch.softmax(t["x"], dim=-1)}),
    description="Logits drawn normal(0, 2); rows of 1024 (256 at 2^10). The row template's naming (x -> y, rows, "
    "cols), so the template library serves the card; the softmax stress sets run (large logits, masks, fully "
    "masked rows, ties, the largest finite value, tiny values, NaN and inf).",
)


# layer_norm, rms_norm ----------------------------------------------------------------------------------------------


def _layer_norm_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    """Two passes in float64: the centred sum of squares does not cancel, and a constant row gives b exactly."""
    x = _f64(inputs["x"])
    with np.errstate(invalid="ignore"):
        centred = x - x.mean(axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True) + LAYER_NORM_EPS)
        return {"y": centred * rstd * _f64(inputs["w"]) + _f64(inputs["b"])}


LAYER_NORM = Task(
    name="layer_norm",
    family="layer_norm",
    summary="y = (x - mean) / sqrt(var + 1e-5) * w + b over each row of x[rows, cols]",
    sizes=_rows_cols,
    inputs=(
        Tensor("x", ("rows", "cols")),
        Tensor("w", ("cols",), distribution=Distribution(mean=1.0, std=0.1)),
        Tensor("b", ("cols",), distribution=Distribution(std=0.1)),
    ),
    outputs=(Tensor("y", ("rows", "cols")),),
    flops="8 * rows * cols",
    baseline=Baseline(
        source=BASELINES.render("layer_norm.cu"),
        entry="layer_norm_naive",
        grid=("cdiv(rows, 256)",),
        block=(256,),
        args=("x", "w", "b", "y", "rows", "cols"),
    ),
    reference=_layer_norm_reference,
    check="a centring norm's tolerance (atol 1e-5 fp32, 1e-3 bf16: outputs near zero carry the mean's rounding); "
    "NaN exactly where the reference is NaN (a row with a NaN or an inf)",
    tolerance=NORM_TOLERANCE,
    vendor=Vendor(
        "PyTorch (F.layer_norm)",
        lambda torch, t, sizes: {
            "y": torch.nn.functional.layer_norm(t["x"], (sizes["cols"],), t["w"], t["b"], eps=LAYER_NORM_EPS)
        },
    ),
    description="x normal(0, 1), w normal(1, 0.1), b normal(0, 0.1); rows of 1024 (256 at 2^10). The row "
    "template's naming and eps, so the template library serves the card; the layer-norm stress sets run (a large "
    "mean, constant rows, large and tiny rows, NaN and inf).",
)


def _rms_norm_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    """float64; an inf makes mean(x^2) inf and the scale 0: the row is 0 with NaN at the inf, as torch gives."""
    x = _f64(inputs["x"])
    with np.errstate(invalid="ignore"):
        scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_NORM_EPS)
        return {"y": x * scale * _f64(inputs["w"])}


RMS_NORM = Task(
    name="rms_norm",
    family="rms_norm",
    summary="y = x / sqrt(mean(x^2) + 1e-6) * w over each row of x[rows, cols]",
    sizes=_rows_cols,
    inputs=(
        Tensor("x", ("rows", "cols")),
        Tensor("w", ("cols",), distribution=Distribution(mean=1.0, std=0.1)),
    ),
    outputs=(Tensor("y", ("rows", "cols")),),
    flops="4 * rows * cols",
    baseline=Baseline(
        source=BASELINES.render("rms_norm.cu"),
        entry="rms_norm_naive",
        grid=("cdiv(rows, 256)",),
        block=(256,),
        args=("x", "w", "y", "rows", "cols"),
    ),
    reference=_rms_norm_reference,
    check="the dtype's tolerance per element (no centring: each output's error is relative to itself); NaN "
    "exactly where the reference is NaN",
    vendor=Vendor(
        "PyTorch (F.rms_norm)",
        lambda torch, t, sizes: {"y": torch.nn.functional.rms_norm(t["x"], (sizes["cols"],), t["w"], eps=RMS_NORM_EPS)},
    ),
    description="x normal(0, 1), w normal(1, 0.1); rows of 1024 (256 at 2^10). The row template's naming and "
    "eps, so the template library serves the card; the rms-norm stress sets run (large, zero and tiny rows, NaN "
    "and inf).",
)


# batch_norm --------------------------------------------------------------------------------------------------------


def _nchw(scale: int) -> Sizes:
    """[n, c, h, w] of `scale` elements: 2 x 8 x 8 x 8 at 2^10, each dimension doubling per factor 16."""
    step = 2 ** ((scale.bit_length() - 1 - 10) // 4)
    return {"n": 2 * step, "c": 8 * step, "h": 8 * step, "w": 8 * step}


def _batch_norm_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    """Per channel over (n, h, w), two passes in float64, the biased variance (torch normalises with it)."""
    x = _f64(inputs["x"])
    centred = x - x.mean(axis=(0, 2, 3), keepdims=True)
    rstd = 1.0 / np.sqrt(np.mean(centred * centred, axis=(0, 2, 3), keepdims=True) + BATCH_NORM_EPS)
    per_channel = (1, -1, 1, 1)
    return {
        "y": centred * rstd * _f64(inputs["weight"]).reshape(per_channel) + _f64(inputs["bias"]).reshape(per_channel)
    }


BATCH_NORM = Task(
    name="batch_norm",
    family="other",
    summary="training-mode batch norm: y = (x - mean_c) / sqrt(var_c + 1e-5) * weight_c + bias_c, statistics of each "
    "channel over (n, h, w) of x[n, c, h, w]",
    sizes=_nchw,
    inputs=(
        Tensor("x", ("n", "c", "h", "w"), distribution=Distribution(mean=0.5, std=2.0)),
        Tensor("weight", ("c",), distribution=Distribution(mean=1.0, std=0.1)),
        Tensor("bias", ("c",), distribution=Distribution(std=0.1)),
    ),
    outputs=(Tensor("y", ("n", "c", "h", "w")),),
    flops="8 * n * c * h * w",
    baseline=Baseline(
        source=BASELINES.render("batch_norm.cu"),
        entry="batch_norm_naive",
        grid=("c",),
        block=(256,),
        args=("x", "weight", "bias", "y", "n", "c", "h * w"),
    ),
    reference=_batch_norm_reference,
    check="a centring norm's tolerance (atol 1e-5 fp32, 1e-3 bf16: outputs near zero carry the mean's rounding)",
    tolerance=NORM_TOLERANCE,
    vendor=Vendor(
        "PyTorch (F.batch_norm, training: cuDNN or its own kernel)",
        lambda torch, t, sizes: {
            "y": torch.nn.functional.batch_norm(
                t["x"], None, None, t["weight"], t["bias"], training=True, eps=BATCH_NORM_EPS
            )
        },
    ),
    description="Training mode, the interesting reduction (inference mode with running statistics is an "
    "elementwise affine map): each channel's mean and biased variance over n*h*w elements that are not contiguous "
    "(h*w runs, c*h*w apart). Only y is an output (not the saved statistics or the running-statistics update). "
    "x normal(0.5, 2), weight normal(1, 0.1), bias normal(0, 0.1); 64 channels of 65536 at 2^22. Family other: "
    "the norm stress families take a row as contiguous, and a channel here is not.",
)


# softmax_attention -------------------------------------------------------------------------------------------------

ATTENTION_SHAPES = {2**10: (1, 16), 2**14: (4, 64), 2**18: (8, 512), 2**22: (16, 4096)}
"""scale -> (heads, seq) with head dimension 64: q holds heads * seq * 64 = scale elements."""


def _attention_sizes(scale: int) -> Sizes:
    heads, seq = ATTENTION_SHAPES[scale]
    return {"heads": heads, "seq": seq, "d": 64}


def _attention_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    """One head at a time in float64 (a 4096 x 4096 score matrix per head, not all heads at once)."""
    q, k, v = (_f64(inputs[name]) for name in ("q", "k", "v"))
    o = np.empty_like(q)
    for h in range(q.shape[0]):
        o[h] = _softmax_last(q[h] @ k[h].T / math.sqrt(q.shape[-1])) @ v[h]
    return {"o": o}


def _sdpa(torch: Any, t: Mapping[str, Any], sizes: Sizes) -> Mapping[str, Any]:
    """Batch of one: [1, heads, seq, d], the layout SDPA's flash and cuDNN backends take."""
    q, k, v = (t[name].unsqueeze(0) for name in ("q", "k", "v"))
    return {"o": torch.nn.functional.scaled_dot_product_attention(q, k, v)[0]}


SOFTMAX_ATTENTION = Task(
    name="softmax_attention",
    family="attention",
    summary="o = softmax(q k^T / sqrt(d)) v per head, q, k, v, o [heads, seq, d], d = 64, no mask",
    sizes=_attention_sizes,
    inputs=(Tensor("q", ("heads", "seq", "d")), Tensor("k", ("heads", "seq", "d")), Tensor("v", ("heads", "seq", "d"))),
    outputs=(Tensor("o", ("heads", "seq", "d")),),
    flops="4 * heads * seq * seq * d + 5 * heads * seq * seq",
    baseline=Baseline(
        source=BASELINES.render("softmax_attention.cu"),
        entry="softmax_attention_naive",
        grid=("cdiv(heads * seq, 256)",),
        block=(256,),
        args=("q", "k", "v", "o", "heads * seq", "seq"),
    ),
    reference=_attention_reference,
    check="per element: fp32 rtol 1e-5, atol 1e-5 (an output is an average of values of either sign: near zero it "
    "carries the rounding of its O(1) terms), bf16 the dtype's tolerance",
    tolerance=ATTENTION_TOLERANCE,
    vendor=Vendor("PyTorch SDPA (flash / cuDNN / memory-efficient)", _sdpa),
    description="Single-sequence multi-head attention without mask or dropout: heads x seq = 1 x 16, 4 x 64, 8 x "
    "512, 16 x 4096, d = 64 throughout (the baseline's registers are sized for it); q, k, v normal(0, 1). The "
    "score matrix is never an input or output: a kernel may keep it or not.",
)


# rope --------------------------------------------------------------------------------------------------------------

ROPE_HEADS, ROPE_DIM = 8, 128
ROPE_BASE = 10000.0


def _rope_sizes(scale: int) -> Sizes:
    return {"tokens": scale // (ROPE_HEADS * ROPE_DIM), "heads": ROPE_HEADS, "d": ROPE_DIM}


def _rope_inputs(rng: np.random.Generator, sizes: Sizes, precision: Precision) -> Arrays:
    """x normal(0, 1); the tables of positions start..start+tokens-1 (start random below 8192), frequencies
    ROPE_BASE^(-2i/d), as a model's rotary cache holds them."""
    tokens, half = sizes["tokens"], sizes["d"] // 2
    positions = rng.integers(0, 8192) + np.arange(tokens, dtype=np.float64)
    angles = positions[:, None] * ROPE_BASE ** (-np.arange(half, dtype=np.float64) / half)
    x = rng.standard_normal((tokens, sizes["heads"], sizes["d"]))
    return _cast(precision, x=x, cos_cache=np.cos(angles), sin_cache=np.sin(angles))


def _rope_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    x = _f64(inputs["x"])
    half = x.shape[-1] // 2
    cos, sin = (_f64(inputs[name])[:, None, :] for name in ("cos_cache", "sin_cache"))
    first, second = x[..., :half], x[..., half:]
    return {"y": np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)}


ROPE = Task(
    name="rope",
    family="other",
    summary="rotary embedding (rotate-half layout) of x[tokens, heads, d] by cos/sin tables [tokens, d/2]",
    sizes=_rope_sizes,
    inputs=(
        Tensor("x", ("tokens", "heads", "d")),
        Tensor("cos_cache", ("tokens", "d / 2")),
        Tensor("sin_cache", ("tokens", "d / 2")),
    ),
    outputs=(Tensor("y", ("tokens", "heads", "d")),),
    flops="3 * tokens * heads * d",
    baseline=Baseline(
        source=BASELINES.render("rope.cu"),
        entry="rope_naive",
        grid=("cdiv(tokens * heads * d, 256)",),
        block=(256,),
        args=("x", "cos_cache", "sin_cache", "y", "tokens * heads * d:i64", "heads", "d"),
    ),
    reference=_rope_reference,
    check="per element: fp32 rtol 1e-5, atol 1e-6 (a difference of two O(1) products, which can cancel: the error "
    "is 2^-24 of the products, not of the result), bf16 the dtype's tolerance",
    generate=_rope_inputs,
    tolerance={"float32": Tolerance(rtol=1e-5, atol=1e-6)},
    description="The GPT-NeoX / Llama layout (rotate_half: pair c with c + d/2), 8 heads of 128, 1 to 4096 tokens "
    "(a decode step at 2^10); the tables are a model's rotary cache for consecutive positions from a random start "
    "(base 10000), drawn by the task's generator. No vendor: torch has no rotary op (models write it as four "
    "elementwise ops and a concatenation; the fused ones live in vLLM, FlashInfer and Apex, outside torch). Family "
    "other: an elementwise stress set writes into every input, and a NaN or huge cos/sin table is not rope's data.",
)


# swiglu, silu_and_mul ----------------------------------------------------------------------------------------------


def _gate_sizes(scale: int) -> Sizes:
    tokens, hidden = _row_grid(scale)
    return {"tokens": tokens, "hidden": hidden}


def _merged_gate_sizes(scale: int) -> Sizes:
    """x [tokens, 2 hidden] holds the scale's elements."""
    tokens, width = _row_grid(scale)
    return {"tokens": tokens, "hidden": width // 2}


SWIGLU = Task(
    name="swiglu",
    family="elementwise",
    summary="y = silu(gate) * up, gate, up, y [tokens, hidden] (SwiGLU's gating on two separate projections)",
    sizes=_gate_sizes,
    inputs=(Tensor("gate", ("tokens", "hidden")), Tensor("up", ("tokens", "hidden"))),
    outputs=(Tensor("y", ("tokens", "hidden")),),
    flops="5 * tokens * hidden",
    baseline=Baseline(
        source=BASELINES.render("swiglu.cu"),
        entry="swiglu_naive",
        grid=("cdiv(tokens * hidden, 256)",),
        block=(256,),
        args=("gate", "up", "y", "tokens * hidden:i64"),
    ),
    reference=lambda inputs, sizes: {"y": _silu(_f64(inputs["gate"])) * _f64(inputs["up"])},
    check="the dtype's tolerance per element; NaN and inf where IEEE arithmetic puts them (silu(-inf) is NaN, as "
    "torch's a / (1 + exp(-a)) gives)",
    stress_skip={"large": SILU_LARGE},
    vendor=Vendor(
        "PyTorch (elementwise)",
        lambda torch, t, sizes: {"y": torch.nn.functional.silu(t["gate"]) * t["up"]},
    ),
    description="SwiGLU's gate (Shazeer 2020) on its two projections already computed into separate tensors, "
    "as a model with separate gate and up weights has them: y = silu(gate) * up element by element. silu_and_mul "
    "is the same arithmetic on vLLM's merged layout (one [tokens, 2 hidden] tensor): a kernel here streams two "
    "inputs of one shape, there it splits each row. The matmuls that make gate and up are dense tasks. The "
    "elementwise template serves it (op swiglu).",
)


SILU_AND_MUL = Task(
    name="silu_and_mul",
    family="elementwise",
    summary="y = silu(x[:, :hidden]) * x[:, hidden:], x [tokens, 2 hidden], y [tokens, hidden] (vLLM's layout)",
    sizes=_merged_gate_sizes,
    inputs=(Tensor("x", ("tokens", "2 * hidden")),),
    outputs=(Tensor("y", ("tokens", "hidden")),),
    flops="5 * tokens * hidden",
    baseline=Baseline(
        source=BASELINES.render("silu_and_mul.cu"),
        entry="silu_and_mul_naive",
        grid=("cdiv(tokens * hidden, 256)",),
        block=(256,),
        args=("x", "y", "tokens * hidden:i64", "hidden"),
    ),
    reference=lambda inputs, sizes: {
        "y": _silu(_f64(inputs["x"])[:, : sizes["hidden"]]) * _f64(inputs["x"])[:, sizes["hidden"] :]
    },
    check="the dtype's tolerance per element; NaN and inf where IEEE arithmetic puts them (silu(-inf) is NaN, as "
    "torch's a / (1 + exp(-a)) gives)",
    stress_skip={"large": SILU_LARGE},
    vendor=Vendor(
        "PyTorch (elementwise)",
        lambda torch, t, sizes: {
            "y": torch.nn.functional.silu(t["x"][:, : sizes["hidden"]]) * t["x"][:, sizes["hidden"] :]
        },
    ),
    description="vLLM's silu_and_mul: the merged gate_up projection's output [tokens, 2 hidden], the first half of "
    "each row gated (silu) and multiplied by the second half. Distinct from swiglu (two separate tensors): here "
    "each row is split. The elementwise template serves it (op silu_and_mul, its split layout).",
)


# merge_attn_states -------------------------------------------------------------------------------------------------

MERGE_HEADS, MERGE_DIM = 4, 128


def _merge_sizes(scale: int) -> Sizes:
    return {"tokens": scale // (MERGE_HEADS * MERGE_DIM), "heads": MERGE_HEADS, "d": MERGE_DIM}


def _merge_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    """Weights exp(lse - max) of each partial state, in float64; lse arrives [heads, tokens] (vLLM's layout)."""
    prefix, suffix = _f64(inputs["prefix_lse"]).T, _f64(inputs["suffix_lse"]).T
    top = np.maximum(prefix, suffix)
    wp, ws = np.exp(prefix - top), np.exp(suffix - top)
    total = wp + ws
    out = (wp[..., None] * _f64(inputs["prefix_output"]) + ws[..., None] * _f64(inputs["suffix_output"])) / total[
        ..., None
    ]
    return {"output": out, "output_lse": (top + np.log(total)).T}


def _lse(name: str) -> Tensor:
    """A log-sum-exp input: float32 at either precision (attention kernels keep it in fp32), spread so that one
    state often dominates."""
    return Tensor(name, ("heads", "tokens"), dtype="float32", distribution=Distribution(std=3.0))


MERGE_ATTN_STATES = Task(
    name="merge_attn_states",
    family="other",
    summary="merge two partial attention outputs [tokens, heads, d] by their log-sum-exp [heads, tokens]: the "
    "merged output and its log-sum-exp",
    sizes=_merge_sizes,
    inputs=(
        Tensor("prefix_output", ("tokens", "heads", "d")),
        _lse("prefix_lse"),
        Tensor("suffix_output", ("tokens", "heads", "d")),
        _lse("suffix_lse"),
    ),
    outputs=(Tensor("output", ("tokens", "heads", "d")), Tensor("output_lse", ("heads", "tokens"), dtype="float32")),
    flops="3 * tokens * heads * d + 8 * tokens * heads",
    baseline=Baseline(
        source=BASELINES.render("merge_attn_states.cu"),
        entry="merge_attn_states_naive",
        grid=("cdiv(tokens * heads * d, 256)",),
        block=(256,),
        args=(
            "prefix_output",
            "prefix_lse",
            "suffix_output",
            "suffix_lse",
            "output",
            "output_lse",
            "tokens * heads * d:i64",
            "tokens",
            "heads",
            "d",
        ),
    ),
    reference=_merge_reference,
    check="per element: fp32 rtol 1e-5, atol 1e-6 (a convex combination of O(1) values of either sign: near zero "
    "it carries expf's rounding of the weights times the values), bf16 the dtype's tolerance; output_lse, fp32 at "
    "either precision, with the precision's tolerance (a task's tolerance is per precision, so a bf16 card checks "
    "it as loosely as the bf16 output)",
    tolerance={"float32": Tolerance(rtol=1e-5, atol=1e-6), "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-5)},
    description="vLLM's merge_attn_states (split-KV / cascade attention): with m = max(lse_a, lse_b), output = "
    "(exp(lse_a - m) a + exp(lse_b - m) b) / (exp(lse_a - m) + exp(lse_b - m)) and output_lse = m + "
    "log(exp(lse_a - m) + exp(lse_b - m)). 4 heads of 128, 2 to 8192 tokens; lse normal(0, 3), finite (vLLM also "
    "maps an empty partition's +inf lse to -inf; not exercised here). No vendor: torch has no such op (vLLM's and "
    "FlashInfer's are extensions outside torch).",
)


# triangle_attention ------------------------------------------------------------------------------------------------

TRIANGLE_HEADS, TRIANGLE_DIM = 4, 32


def _triangle_sizes(scale: int) -> Sizes:
    """n residues with n^2 * 4 * 32 = 2 * scale (q is the largest tensor): n = 4, 16, 64, 256."""
    return {"n": 2 ** ((scale.bit_length() - 1 - 6) // 2), "heads": TRIANGLE_HEADS, "c": TRIANGLE_DIM}


def _triangle_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    """One head at a time in float64: scores [i, j, k] = q[i, j] . k[i, k] / sqrt(c) + bias[j, k]."""
    q, k, v, bias = (_f64(inputs[name]) for name in ("q", "k", "v", "bias"))
    o = np.empty_like(q)
    for h in range(q.shape[2]):
        scores = q[:, :, h] @ k[:, :, h].transpose(0, 2, 1) / math.sqrt(q.shape[-1]) + bias[None, :, :, h]
        o[:, :, h] = _softmax_last(scores) @ v[:, :, h]
    return {"o": o}


TRIANGLE_ATTENTION = Task(
    name="triangle_attention",
    family="attention",
    summary="AlphaFold's triangle attention around the starting node: o[i, j, h] = sum_k softmax_k(q[i, j, h] . "
    "k[i, k, h] / sqrt(c) + bias[j, k, h]) v[i, k, h], pair tensors [n, n, heads, c]",
    sizes=_triangle_sizes,
    inputs=(
        Tensor("q", ("n", "n", "heads", "c")),
        Tensor("k", ("n", "n", "heads", "c")),
        Tensor("v", ("n", "n", "heads", "c")),
        Tensor("bias", ("n", "n", "heads")),
    ),
    outputs=(Tensor("o", ("n", "n", "heads", "c")),),
    flops="4 * n * n * n * heads * c + 6 * n * n * n * heads",
    baseline=Baseline(
        source=BASELINES.render("triangle_attention.cu"),
        entry="triangle_attention_naive",
        grid=("cdiv(n * n * heads, 256)",),
        block=(256,),
        args=("q", "k", "v", "bias", "o", "n", "heads"),
    ),
    reference=_triangle_reference,
    check="per element: fp32 rtol 1e-5, atol 1e-5 (an average over n values of either sign: near zero it carries "
    "the rounding of its O(1) terms), bf16 the dtype's tolerance",
    tolerance=ATTENTION_TOLERANCE,
    description="AlphaFold 2's triangular gated self-attention around the starting node (supplement Algorithm 13), "
    "its attention core as DeepSpeed's Evoformer attention and cuEquivariance's triangle_attention compute it: for "
    "each row i of the pair representation, query (i, j) attends over keys (i, k), k = 0..n-1, with the bias "
    "b[j, k, h] (a projection of the pair tensor z[j, k]) added to the scores. The layer norm, the projections "
    "that make q, k, v, bias and the gate, the sigmoid gate and the output projection are outside the task (dense "
    "and elementwise tasks). 4 heads of c = 32 (AlphaFold's), n = 4, 16, 64, 256 residues; inputs normal(0, 1). "
    "No vendor: torch has no triangle attention (DeepSpeed and cuEquivariance do, outside torch); SDPA with the "
    "bias as a float mask would need q, k, v permuted to [i, h, j, c], copies that would be timed with it.",
)


# top_k -------------------------------------------------------------------------------------------------------------

TOP_K = 8
TIE_STEP = 0.25
"""Every other row of top_k's inputs is rounded to multiples of this: its top values tie (2.5, 2.75, 3, ...)."""


def _top_k_inputs(rng: np.random.Generator, sizes: Sizes, precision: Precision) -> Arrays:
    """normal(0, 1) rows, every other one rounded to TIE_STEP so that the top k tie at either precision (bf16 rows
    tie on their own as well: 8 bits of mantissa)."""
    x = rng.standard_normal((sizes["rows"], sizes["cols"]))
    x[1::2] = np.round(x[1::2] / TIE_STEP) * TIE_STEP
    return _cast(precision, x=x)


def _top_k_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    """A stable sort of the negated values: descending, equal values in index order (the lower index first)."""
    x = _f64(inputs["x"])
    order = np.argsort(-x, axis=-1, kind="stable")[:, : sizes["k"]]
    return {"values": np.take_along_axis(x, order, axis=-1), "indices": order.astype(np.int32)}


def _topk(torch: Any, t: Mapping[str, Any], sizes: Sizes) -> Mapping[str, Any]:
    values, indices = torch.topk(t["x"], sizes["k"], dim=-1)
    return {"values": values, "indices": indices.to(torch.int32)}


TOP_K_TASK = Task(
    name="top_k",
    family="sort",
    summary="the k = 8 largest values of each row of x[rows, cols], descending, with their int32 column indices",
    sizes=lambda scale: {**_rows_cols(scale), "k": TOP_K},
    inputs=(Tensor("x", ("rows", "cols")),),
    outputs=(Tensor("values", ("rows", "k")), Tensor("indices", ("rows", "k"), dtype="int32")),
    flops="rows * cols",
    baseline=Baseline(
        source=BASELINES.render("top_k.cu"),
        entry="top_k_naive",
        grid=("cdiv(rows, 256)",),
        block=(256,),
        args=("x", "values", "indices", "rows", "cols", "k"),
    ),
    reference=_top_k_reference,
    check="indices exact (int32) under the tie rule: values descending, equal values in increasing index order (the "
    "lower index first; a stable argsort of -x), so a kernel that breaks ties any other way fails on the tied rows "
    "every input set has; values exact too (they are copies of input elements); -0.0 ties with +0.0",
    generate=_top_k_inputs,
    tolerance={"float32": EXACT, "bfloat16": EXACT},
    vendor=Vendor("CUB / sort (torch.topk)", _topk),
    description="Rows of 1024 (256 at 2^10), k = 8; normal(0, 1) values, every other row rounded to multiples of "
    "0.25 so that the top values tie at either precision. Inputs are finite (the sort family runs no stress sets; "
    "torch.topk would rank NaN highest). torch.topk does not promise which of equal values comes first, so the "
    "vendor's indices may differ from ours on ties: it is timed, not held to the tie rule.",
)


TASKS: tuple[Task, ...] = (
    SOFTMAX,
    LAYER_NORM,
    RMS_NORM,
    BATCH_NORM,
    SOFTMAX_ATTENTION,
    ROPE,
    SWIGLU,
    SILU_AND_MUL,
    MERGE_ATTN_STATES,
    TRIANGLE_ATTENTION,
    TOP_K_TASK,
)
