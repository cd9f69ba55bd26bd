"""Suite tasks: activation functions, and the reductions and losses over whole vectors.

Activations are elementwise maps (family elementwise), so every card runs the large, max-finite, tiny and nan-inf
stress sets on its input, and each reference gives what torch gives there: NaN stays NaN (relu included, as
torch.relu keeps it), sigmoid and tanh saturate to their limits without NaN, elu and selu use torch's constants
(alpha 1; selu's alpha and scale), leaky_relu torch's default slope 0.01, gelu is the exact erf form and, like
torch's x * 0.5 * (1 + erf(x / sqrt 2)), NaN at -inf (-inf * 0). Each baseline is a thread per element in fp32.

What MSKernelBench's task names are taken to mean (its sources are not at hand; the choices are written down):
- row_tanh is tanh over a row-major [rows, 256] matrix, element by element ("row": the matrix layout, as the
  KernelBench/Tensara tanh over an M x N matrix; nothing is reduced along a row); its baseline is a 2-D grid.
- cross_entropy gives the per-sample losses, loss[i] = logsumexp(logits[i]) - logits[i, targets[i]] (torch's
  reduction="none"), over logits[n, 256] with int32 targets. It is a row operator like softmax (family softmax, so
  its logits run the softmax stress sets: large logits, masks, fully masked rows, ties, NaN and inf), and a
  per-sample output is checked row by row where a mean would be NaN as soon as one row is; the batch mean would
  add one more full reduction, which dot_product, mse_loss and hinge_loss already are.
- dot_product, mse_loss and hinge_loss give one value (shape (1,)): a sum (dot_product) or a mean (the losses, as
  torch's default reduction). Their baseline is one block of 1024 threads: strided fp32 partial sums, then a
  shared-memory tree, thread 0 writing the result (outputs are poisoned before each launch, so nothing may
  accumulate into them, and a card gives no zeroed memory for a grid-wide counter). At 2^22 that is 4096 loads
  a thread: a few milliseconds on one SM.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import DEFAULT_TOLERANCE, Distribution, Tolerance
from kernelforge_tui.suite.task import BASELINES, Arrays, Baseline, Precision, Sizes, Task, Tensor, Vendor

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
"""torch.selu's constants (Klambauer et al. 2017)."""
LEAKY_SLOPE = 0.01
"""torch.nn.functional.leaky_relu's default negative slope."""
ROW_COLS = 256
CLASSES = 256
F32_DEFAULT = DEFAULT_TOLERANCE["float32"]
BF16_RTOL = DEFAULT_TOLERANCE["bfloat16"].rtol
"""The dtypes' own tolerances, kept where a task widens only the other part."""
SUM_THREADS = 1024
"""Threads of the single-block baseline of the full reductions."""

ACTIVATION_CHECK = (
    "the dtype's tolerance: one fp32 evaluation of the function (CUDA's expf, expm1f, erff, tanhf are within 2 "
    "ulp) rounded once to the output; on the stress sets NaN stays NaN and +-inf and the largest values map to the "
    "function's limits as torch gives them"
)


def _f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def _map_kernel(name: str, expression: str) -> Baseline:
    """A thread per element: y[i] = f(x[i]) in fp32, `expression` over `v` = x[i]."""
    return Baseline(
        source=BASELINES.render("map.cu", name=name, expression=expression),
        entry=f"{name}_naive",
        grid=("cdiv(n, 256)",),
        block=(256,),
        args=("x", "y", "n"),
    )


def _activation(
    name: str,
    summary: str,
    expression: str,
    function: Callable[[np.ndarray], np.ndarray],
    flops: int,
    vendor: Callable[..., object],
    tolerance: dict[Precision, Tolerance] | None = None,
) -> Task:
    """An activation y = f(x) over x[n]; `function` is its float64 NumPy reference, `vendor(torch, x)` torch's.

    `flops` per element: a compare, an arithmetic operation or a transcendental call counts one (gelu 8, as the
    captured gelu cards count it)."""
    return Task(
        name=name,
        family="elementwise",
        summary=summary,
        sizes=lambda scale: {"n": scale},
        inputs=(Tensor("x", ("n",)),),
        outputs=(Tensor("y", ("n",)),),
        flops=f"{flops} * n",
        baseline=_map_kernel(name, expression),
        reference=lambda inputs, sizes: {"y": function(_f64(inputs["x"]))},
        check=ACTIVATION_CHECK,
        tolerance=tolerance or {},
        vendor=Vendor("PyTorch (elementwise)", lambda torch, t, sizes: {"y": vendor(torch, t["x"])}),
    )


def relu(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.maximum(x, 0.0))  # np.maximum propagates NaN, as torch.relu does


def leaky_relu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, LEAKY_SLOPE * x)


def elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))  # the minimum keeps expm1 from overflowing


def selu(x: np.ndarray) -> np.ndarray:
    return SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(np.minimum(x, 0.0)))


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def gelu(x: np.ndarray) -> np.ndarray:
    """x * Phi(x) as 0.5 x erfc(-x / sqrt 2): no cancellation for negative x (1 + erf does cancel), NaN at -inf."""
    return np.asarray(0.5 * x * _erfc(-x / math.sqrt(2.0)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The two-sided form: exp(-|x|) never overflows, so +-inf give exactly 1 and 0."""
    e = np.exp(-np.abs(x))
    return np.asarray(np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)))


RELU = _activation(
    "relu",
    "y = max(x, 0) over n elements (NaN stays NaN)",
    "(v > 0.0f || v != v) ? v : 0.0f",  # fmaxf(v, 0) would turn NaN into 0, where torch.relu keeps it
    relu,
    1,
    lambda torch, x: torch.relu(x),
)
LEAKY_RELU = _activation(
    "leaky_relu",
    "y = x for x > 0, 0.01 x otherwise, over n elements",
    "v > 0.0f ? v : 0.01f * v",
    leaky_relu,
    2,
    lambda torch, x: torch.nn.functional.leaky_relu(x),
)
ELU = _activation(
    "elu",
    "y = x for x > 0, exp(x) - 1 otherwise (alpha 1), over n elements",
    "v > 0.0f ? v : expm1f(v)",
    elu,
    3,
    lambda torch, x: torch.nn.functional.elu(x),
)
SELU = _activation(
    "selu",
    "y = scale * (x for x > 0, alpha * (exp(x) - 1) otherwise), torch's alpha and scale, over n elements",
    "v > 0.0f ? 1.0507009873554805f * v : 1.7580993408473766f * expm1f(v)",  # alpha * scale, as torch folds it
    selu,
    4,
    lambda torch, x: torch.selu(x),
)
GELU = _activation(
    "gelu",
    "y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) over n elements (the exact form, not the tanh approximation)",
    "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))",
    gelu,
    8,
    lambda torch, x: torch.nn.functional.gelu(x),
    # 1 + erf(x / sqrt 2) cancels for negative x: erff's error near -1 (2 ulp = 1.2e-7) times 0.5|x| for |x|
    # below 5.9 (beyond, erff is exactly -1 and the output 0, off by under 1e-8) is up to 3.5e-7 absolute on
    # outputs from -4e-3 (x = -3) down to -1e-8, far beyond rtol * |y| there; torch's fp32 gelu errs alike.
    tolerance={"float32": Tolerance(rtol=F32_DEFAULT.rtol, atol=1e-6)},
)
SIGMOID = _activation(
    "sigmoid",
    "y = 1 / (1 + exp(-x)) over n elements",
    "1.0f / (1.0f + expf(-v))",
    sigmoid,
    4,
    lambda torch, x: torch.sigmoid(x),
)

ROW_TANH = Task(
    name="row_tanh",
    family="elementwise",
    summary=f"y = tanh(x) over a row-major [rows, {ROW_COLS}] matrix, element by element",
    sizes=lambda scale: {"rows": scale // ROW_COLS, "cols": ROW_COLS},
    inputs=(Tensor("x", ("rows", "cols")),),
    outputs=(Tensor("y", ("rows", "cols")),),
    flops="4 * rows * cols",
    baseline=Baseline(
        source=BASELINES.render("row_tanh.cu"),
        entry="row_tanh_naive",
        grid=("cdiv(cols, 256)", "rows"),
        block=(256,),
        args=("x", "y", "rows", "cols"),
    ),
    reference=lambda inputs, sizes: {"y": np.tanh(_f64(inputs["x"]))},
    check=ACTIVATION_CHECK,
    vendor=Vendor("PyTorch (elementwise)", lambda torch, t, sizes: {"y": torch.tanh(t["x"])}),
    description="MSKernelBench's row_tanh read as tanh over a matrix (rows of 256), not a reduction along rows.",
)


def cross_entropy(inputs: Arrays, sizes: Sizes) -> Arrays:
    """logsumexp(row) - row[target], with the max subtracted; a NaN or +inf in a row, or a row of -inf only, gives
    NaN (exp(x - max) is exp(NaN) there), a -inf target logit +inf: what torch's cross_entropy gives."""
    x = _f64(inputs["logits"])
    top = x.max(axis=1)  # propagates NaN
    total = np.exp(x - top[:, None]).sum(axis=1)
    picked = x[np.arange(x.shape[0]), inputs["targets"].astype(np.int64)]
    return {"loss": np.log(total) + (top - picked)}


CROSS_ENTROPY = Task(
    name="cross_entropy",
    family="softmax",
    summary=f"loss[i] = logsumexp(logits[i]) - logits[i, targets[i]] over logits[n, {CLASSES}] (per sample)",
    sizes=lambda scale: {"n": scale // CLASSES, "classes": CLASSES},
    inputs=(
        Tensor("logits", ("n", "classes")),
        Tensor("targets", ("n",), "int32", Distribution(kind="randint", low=0, high=CLASSES)),
    ),
    outputs=(Tensor("loss", ("n",)),),
    flops="4 * n * classes",
    baseline=Baseline(
        source=BASELINES.render("cross_entropy.cu"),
        entry="cross_entropy_naive",
        grid=("cdiv(n, 256)",),
        block=(256,),
        args=("logits", "targets", "loss", "n", "classes"),
    ),
    reference=cross_entropy,
    check=(
        "per-sample losses within rtol and an atol of 2 * classes * 2^-24: the loss is log(s) + (max - x[t]) with "
        "s = sum of exp(x - max) in [1, classes], and an fp32 sum of classes terms errs by up to classes * 2^-24 "
        "relative (reached when the max dominates and every other term is swamped), plus up to classes * 2^-24 / e "
        "from rounding x - max inside exp and 2 ulp from expf; that is absolute in log(s), and where the loss is "
        "near 0 rtol cannot cover it. Targets are always in range; stress sets write only the logits"
    ),
    # 2 * 256 * 2^-24 = 3.05e-5 (see check); bf16 logits sum in fp32 alike, the bf16 rounding of the loss is rtol's.
    tolerance={
        "float32": Tolerance(rtol=F32_DEFAULT.rtol, atol=3e-5),
        "bfloat16": Tolerance(rtol=BF16_RTOL, atol=3e-5),
    },
    vendor=Vendor(
        "PyTorch (log_softmax + nll_loss)",
        lambda torch, t, sizes: {
            "loss": torch.nn.functional.cross_entropy(t["logits"], t["targets"].long(), reduction="none")
        },
    ),
    description=(
        "Logits normal(0, 1), targets uniform over the classes. Per-sample losses (reduction='none'); torch needs "
        "int64 targets, so the vendor's time includes that conversion."
    ),
)


def _single_block_sum(name: str, tensors: tuple[str, str, str], term: str, mean: bool) -> Baseline:
    """One block of SUM_THREADS threads: strided fp32 partial sums of `term` (over x and y, the two inputs' values
    at i), a shared-memory tree, and thread 0 writing the sum (or the mean) to the output's one element.
    `tensors`: the two inputs and the output."""
    first, second, out = tensors
    return Baseline(
        source=BASELINES.render(
            "single_block_sum.cu",
            name=name,
            threads=SUM_THREADS,
            first=first,
            second=second,
            out=out,
            term=term,
            mean=mean,
        ),
        entry=f"{name}_naive",
        grid=(1,),
        block=(SUM_THREADS,),
        args=(first, second, out, "n"),
    )


MEAN_RTOL = 3e-5
"""fp32 rtol of a mean of n >= 0 terms. The baseline's longest chain of dependent fp32 additions at 2^22 is
D = 4096 + 10 (a thread's terms, then the tree); the deterministic bound D * 2^-24 = 2.4e-4 needs every rounding
to err the same way, while Higham and Mary's probabilistic bound 6 * sqrt(D) * 2^-24 = 2.3e-5 holds but for a
chance of 2 exp(-18). Simulated, the baseline's order errs by at most 6e-7 relative; an fp16 or bf16 accumulator
errs by 1e-3 and more."""


def _dot_inputs(rng: np.random.Generator, sizes: Sizes, precision: Precision) -> Arrays:
    """a, b normal with std n^-1/4: the dot product is O(1) (std 1) at every scale, so one tolerance means the same
    at 2^10 and 2^22, and one dropped or doubled term (about n^-1/2) is far outside it."""
    n = sizes["n"]
    return {k: (rng.standard_normal(n) * n**-0.25).astype(NUMPY[precision]) for k in ("a", "b")}


DOT_PRODUCT = Task(
    name="dot_product",
    family="reduction",
    summary="out = sum of a[i] * b[i] over n elements (one value)",
    sizes=lambda scale: {"n": scale},
    inputs=(Tensor("a", ("n",)), Tensor("b", ("n",))),
    outputs=(Tensor("out", (1,)),),
    flops="2 * n",
    baseline=_single_block_sum("dot_product", ("a", "b", "out"), "x * y", mean=False),
    reference=lambda inputs, sizes: {"out": np.array([np.dot(_f64(inputs["a"]), _f64(inputs["b"]))])},
    generate=_dot_inputs,
    check=(
        "one value within rtol 1e-5 (fp32) and atol 2e-5: the inputs have std n^-1/4, so the result has std 1 at "
        "every scale and the fp32 sum's error follows its partial sums (random walks), about 2^-24 * n^-1/2 * "
        "4096 * sqrt(1024 / 2) = 2.7e-6 for the baseline's order at 2^22 (simulated: at most 8.5e-7); one "
        "dropped or doubled term, about n^-1/2 (5e-4 at 2^22), fails"
    ),
    tolerance={
        "float32": Tolerance(rtol=F32_DEFAULT.rtol, atol=2e-5),  # see check: ~7x the estimate, ~25x the simulated worst
        "bfloat16": Tolerance(rtol=BF16_RTOL, atol=2e-5),  # the same fp32 sum; rtol takes the bf16 rounding
    },
    vendor=Vendor("PyTorch (cuBLAS dot)", lambda torch, t, sizes: {"out": torch.dot(t["a"], t["b"]).reshape(1)}),
    description="a and b normal with std n^-1/4 (drawn by the task), so the dot product is O(1) at every scale.",
)

MSE_LOSS = Task(
    name="mse_loss",
    family="reduction",
    summary="loss = mean of (pred[i] - target[i])^2 over n elements (one value)",
    sizes=lambda scale: {"n": scale},
    inputs=(Tensor("pred", ("n",)), Tensor("target", ("n",))),
    outputs=(Tensor("loss", (1,)),),
    flops="3 * n",
    baseline=_single_block_sum("mse_loss", ("pred", "target", "loss"), "(x - y) * (x - y)", mean=True),
    reference=lambda inputs, sizes: {"loss": np.array([np.mean((_f64(inputs["pred"]) - _f64(inputs["target"])) ** 2)])},
    check="one value within rtol 3e-5 in fp32 (a mean of non-negative terms: see MEAN_RTOL), bf16's default",
    tolerance={"float32": Tolerance(rtol=MEAN_RTOL, atol=F32_DEFAULT.atol)},
    vendor=Vendor(
        "PyTorch (mse_loss)",
        lambda torch, t, sizes: {"loss": torch.nn.functional.mse_loss(t["pred"], t["target"]).reshape(1)},
    ),
    description="pred and target normal(0, 1); the mean as torch's default reduction gives it.",
)


def _hinge_inputs(rng: np.random.Generator, sizes: Sizes, precision: Precision) -> Arrays:
    """pred normal(0, 1); target -1 or +1 with equal odds."""
    n = sizes["n"]
    target = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return {"pred": rng.standard_normal(n).astype(NUMPY[precision]), "target": target.astype(NUMPY[precision])}


HINGE_LOSS = Task(
    name="hinge_loss",
    family="reduction",
    summary="loss = mean of max(0, 1 - pred[i] * target[i]) over n elements, target in {-1, +1} (one value)",
    sizes=lambda scale: {"n": scale},
    inputs=(Tensor("pred", ("n",)), Tensor("target", ("n",))),
    outputs=(Tensor("loss", (1,)),),
    flops="4 * n",
    # max(0, d) that keeps NaN as the reference's np.maximum does (fmaxf would drop it)
    baseline=_single_block_sum(
        "hinge_loss", ("pred", "target", "loss"), "(1.0f - x * y < 0.0f ? 0.0f : 1.0f - x * y)", mean=True
    ),
    reference=lambda inputs, sizes: {
        "loss": np.array([np.mean(np.maximum(0.0, 1.0 - _f64(inputs["pred"]) * _f64(inputs["target"])))])
    },
    generate=_hinge_inputs,
    check="one value within rtol 3e-5 in fp32 (a mean of non-negative terms: see MEAN_RTOL), bf16's default",
    tolerance={"float32": Tolerance(rtol=MEAN_RTOL, atol=F32_DEFAULT.atol)},
    vendor=Vendor(
        "PyTorch (elementwise + mean: torch has no hinge loss of this form)",
        lambda torch, t, sizes: {"loss": torch.clamp_min(1.0 - t["pred"] * t["target"], 0.0).mean().reshape(1)},
    ),
    description="pred normal(0, 1), target -1 or +1 (drawn by the task); the binary SVM hinge loss, mean.",
)


TASKS: tuple[Task, ...] = (
    RELU,
    LEAKY_RELU,
    ELU,
    SELU,
    GELU,
    SIGMOID,
    ROW_TANH,
    DOT_PRODUCT,
    CROSS_ENTROPY,
    MSE_LOSS,
    HINGE_LOSS,
)
