"""Suite tasks over dense vectors and matrices: copies, transposes, products, contractions.

Each baseline is what a student writes first: a thread per output element (a block per row where a row of the
output depends on the previous one), loads straight from global memory, no tiling, no vectors, fp32 sums; each
reference is NumPy in float64 and shares nothing with the baseline.

Shapes: scale = 2^L elements of the largest tensor and s = 2^(L/2) (the scales are even powers of two). The copies
run on a tall matrix (2s x s/2, so a transpose that swaps the wrong index fails on shape, not only on values); the
products keep every size a power of two, so the template library's tiles divide them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import EXACT, Tolerance
from kernelforge_tui.suite.task import BASELINES, Arrays, Baseline, Precision, Sizes, Task, Tensor, Vendor

POWER = 4
"""matrix_power computes A^4: two squarings, so its FLOP count is two products."""
UNIT_ROUNDING = 2.0**-24
"""fp32's unit roundoff: the relative error of one rounded operation."""
BF16_RTOL = 1.6e-2
"""PyTorch's bf16 rtol (the card default): a bf16 output is one rounding (2^-9 relative) of its fp32 value, and
the reference's own rounding to bf16 can land one bf16 step (2^-8) away."""
EXACT_CHECK = "bit-exact: a copy moves values, it computes nothing (both precisions; the sign of zero aside)"


def _f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def _side(scale: int) -> int:
    """s = sqrt(scale): the side of a square matrix of `scale` elements."""
    side = 1 << (scale.bit_length() - 1) // 2
    if side * side != scale:
        raise ValueError(f"dense tasks run at even powers of two, not {scale}")
    return side


def _tall(scale: int) -> Sizes:
    return {"rows": 2 * _side(scale), "cols": _side(scale) // 2}


def sum_tolerance(terms: int) -> dict[Precision, Tolerance]:
    """Outputs that are fp32 sums of `terms` products of unit-variance values (the task's longest sum).

    A sequential fp32 sum rounds each partial sum s_i (|s_i| ~ sqrt(i) for random signs), so its error spreads
    by at most about 2^-24 x terms / sqrt(6); the largest over 4096 outputs of a simulated 2048-term sum is
    2.5e-4 (tests/suite/tasks/test_dense.py). atol = 16 x 2^-24 x terms (1.95e-3 there) leaves about 8x room, and a
    blocked or split sum errs less, so an honest fp32 kernel passes in any order. It is absolute because an
    output near zero has no relative scale, and it still refuses TF32 or fp16 inputs (2^-11 per product: most
    outputs fail) and bf16 partial sums. fp32 keeps rtol 1e-5 (the reference's rounding to fp32 is 2^-24
    relative); bf16 adds only its output rounding, which its rtol covers, and needs the same atol for its sums.
    """
    atol = 16 * UNIT_ROUNDING * terms
    return {"float32": Tolerance(rtol=1e-5, atol=atol), "bfloat16": Tolerance(rtol=BF16_RTOL, atol=atol)}


EXACT_TOLERANCE: dict[Precision, Tolerance] = {"float32": EXACT, "bfloat16": EXACT}


VECTOR_ADD = Task(
    name="vector_add",
    family="elementwise",
    summary="c = a + b over n elements",
    sizes=lambda scale: {"n": scale},
    inputs=(Tensor("a", ("n",)), Tensor("b", ("n",))),
    outputs=(Tensor("c", ("n",)),),
    flops="n",
    baseline=Baseline(
        source=BASELINES.render("vector_add.cu"),
        entry="vector_add_naive",
        grid=("cdiv(n, 256)",),
        block=(256,),
        args=("a", "b", "c", "n"),
    ),
    reference=lambda inputs, sizes: {"c": _f64(inputs["a"]) + _f64(inputs["b"])},
    check="the dtype's tolerance: one rounding of an exact sum",
    vendor=Vendor("PyTorch (elementwise)", lambda torch, t, sizes: {"c": torch.add(t["a"], t["b"])}),
)


REVERSE_ARRAY = Task(
    name="reverse_array",
    family="copy",
    summary="y[i] = x[n - 1 - i] over n elements",
    sizes=lambda scale: {"n": scale},
    inputs=(Tensor("x", ("n",)),),
    outputs=(Tensor("y", ("n",)),),
    flops="n",  # no arithmetic: a copy weighs by the elements it moves
    baseline=Baseline(
        source=BASELINES.render("reverse_array.cu"),
        entry="reverse_array_naive",
        grid=("cdiv(n, 256)",),
        block=(256,),
        args=("x", "y", "n"),
    ),
    reference=lambda inputs, sizes: {"y": _f64(inputs["x"])[::-1].copy()},
    check=EXACT_CHECK,
    tolerance=EXACT_TOLERANCE,
    vendor=Vendor("PyTorch (flip)", lambda torch, t, sizes: {"y": torch.flip(t["x"], [0])}),
)


_GRID_2D = ("cdiv(cols, 16)", "cdiv(rows, 16)")

MATRIX_COPY = Task(
    name="matrix_copy",
    family="copy",
    summary="B = A, a rows x cols matrix (rows = 4 cols)",
    sizes=_tall,
    inputs=(Tensor("A", ("rows", "cols")),),
    outputs=(Tensor("B", ("rows", "cols")),),
    flops="rows * cols",  # no arithmetic: a copy weighs by the elements it moves
    baseline=Baseline(
        source=BASELINES.render("copy_2d.cu", entry="matrix_copy_naive", transpose=False),
        entry="matrix_copy_naive",
        grid=_GRID_2D,
        block=(16, 16),
        args=("A", "B", "rows", "cols"),
    ),
    reference=lambda inputs, sizes: {"B": _f64(inputs["A"]).copy()},
    check=EXACT_CHECK,
    tolerance=EXACT_TOLERANCE,
    vendor=Vendor("PyTorch (clone)", lambda torch, t, sizes: {"B": t["A"].clone()}),
)

MATRIX_TRANSPOSE = Task(
    name="matrix_transpose",
    family="copy",
    summary="B = A^T: A is rows x cols (rows = 4 cols), B is cols x rows",
    sizes=_tall,
    inputs=(Tensor("A", ("rows", "cols")),),
    outputs=(Tensor("B", ("cols", "rows")),),
    flops="rows * cols",  # no arithmetic: a transpose weighs by the elements it moves
    baseline=Baseline(
        source=BASELINES.render("copy_2d.cu", entry="matrix_transpose_naive", transpose=True),
        entry="matrix_transpose_naive",
        grid=_GRID_2D,
        block=(16, 16),
        args=("A", "B", "rows", "cols"),
    ),
    reference=lambda inputs, sizes: {"B": _f64(inputs["A"]).T.copy()},
    check=EXACT_CHECK,
    tolerance=EXACT_TOLERANCE,
    vendor=Vendor("PyTorch (t().contiguous())", lambda torch, t, sizes: {"B": t["A"].t().contiguous()}),
    description="The baseline reads A along rows (coalesced) and writes B with a stride of rows elements.",
)


MATRIX_SCALAR_MUL = Task(
    name="matrix_scalar_mul",
    family="elementwise",
    summary="B = s * A: a side x side matrix times a scalar held in a one-element tensor",
    sizes=lambda scale: {"side": _side(scale)},
    inputs=(Tensor("A", ("side", "side")), Tensor("s", (1,))),
    outputs=(Tensor("B", ("side", "side")),),
    flops="side * side",
    baseline=Baseline(
        source=BASELINES.render("matrix_scalar_mul.cu"),
        entry="matrix_scalar_mul_naive",
        grid=("cdiv(side, 16)", "cdiv(side, 16)"),
        block=(16, 16),
        args=("A", "s", "B", "side"),
    ),
    reference=lambda inputs, sizes: {"B": _f64(inputs["A"]) * _f64(inputs["s"])[0]},
    check="the dtype's tolerance: the product of two fp32 (or bf16) values is exact in float64, so the reference "
    "and an fp32 kernel round the same value once; stress sets (every input, the scalar too) overflow to inf, "
    "underflow, and carry NaN and inf as IEEE multiplication does",
    vendor=Vendor("PyTorch (elementwise)", lambda torch, t, sizes: {"B": torch.mul(t["A"], t["s"])}),
    description="The scalar is an input (a tensor of one element), so a kernel cannot bake its value in; torch "
    "broadcasts it. Stress values go into both inputs, as into every elementwise task's.",
)


MATRIX_VECTOR_MUL = Task(
    name="matrix_vector_mul",
    family="matmul",
    summary="y = A x: A is M x K, x has K elements",
    sizes=lambda scale: {"M": _side(scale), "K": _side(scale)},
    inputs=(Tensor("A", ("M", "K")), Tensor("x", ("K",))),
    outputs=(Tensor("y", ("M",)),),
    flops="2 * M * K",
    baseline=Baseline(
        source=BASELINES.render("matrix_vector_mul.cu"),
        entry="matrix_vector_mul_naive",
        grid=("cdiv(M, 256)",),
        block=(256,),
        args=("A", "x", "y", "M", "K"),
    ),
    reference=lambda inputs, sizes: {"y": _f64(inputs["A"]) @ _f64(inputs["x"])},
    check="sums of K = 2048 products at most: rtol as the dtype's, atol 16 x 2^-24 x 2048 (sum_tolerance)",
    tolerance=sum_tolerance(2048),
    vendor=Vendor("cuBLAS (torch.mv)", lambda torch, t, sizes: {"y": torch.mv(t["A"], t["x"])}),
)


def _matmul_baseline(m: str, n: str, k: str) -> Baseline:
    return Baseline(
        source=BASELINES.render("matmul.cu"),
        entry="matmul_naive",
        grid=(f"cdiv({n}, 16)", f"cdiv({m}, 16)"),
        block=(16, 16),
        args=("A", "B", "C", m, n, k),
    )


def _matmul_reference(inputs: Arrays, sizes: Sizes) -> Arrays:
    return {"C": _f64(inputs["A"]) @ _f64(inputs["B"])}


def _mm(torch: Any, t: Mapping[str, Any], sizes: Sizes) -> dict[str, Any]:
    return {"C": torch.mm(t["A"], t["B"])}


MATRIX_MUL = Task(
    name="matrix_mul",
    family="matmul",
    summary="C = A B with M, N and K all different: A is M x K, B is K x N (M = 2s, N = s, K = s/2)",
    sizes=lambda scale: {"M": 2 * _side(scale), "N": _side(scale), "K": _side(scale) // 2},
    inputs=(Tensor("A", ("M", "K")), Tensor("B", ("K", "N"))),
    outputs=(Tensor("C", ("M", "N")),),
    flops="2 * M * N * K",
    baseline=_matmul_baseline("M", "N", "K"),
    reference=_matmul_reference,
    check="sums of K = 1024 products at most: rtol as the dtype's, atol 16 x 2^-24 x 1024 (sum_tolerance)",
    tolerance=sum_tolerance(1024),
    vendor=Vendor("cuBLAS (torch.mm)", _mm),
    description="C (2 x scale elements) is the largest tensor: the product is wide and shallow.",
)

SQUARE_MATRIX_MUL = Task(
    name="square_matrix_mul",
    family="matmul",
    summary="C = A B for n x n matrices",
    sizes=lambda scale: {"n": _side(scale)},
    inputs=(Tensor("A", ("n", "n")), Tensor("B", ("n", "n"))),
    outputs=(Tensor("C", ("n", "n")),),
    flops="2 * n * n * n",
    baseline=_matmul_baseline("n", "n", "n"),
    reference=_matmul_reference,
    check="sums of n = 2048 products at most: rtol as the dtype's, atol 16 x 2^-24 x 2048 (sum_tolerance)",
    tolerance=sum_tolerance(2048),
    vendor=Vendor("cuBLAS (torch.mm)", _mm),
)


def _power_inputs(rng: np.random.Generator, sizes: Sizes, precision: Precision) -> Arrays:
    """Entries normal with variance 1/n: A's spectral radius is then about 1 (the circular law), so every power
    has entries of about 1/sqrt(n), neither overflowing nor vanishing at any n."""
    n = sizes["n"]
    return {"A": (rng.standard_normal((n, n)) / np.sqrt(n)).astype(NUMPY[precision])}


MATRIX_POWER = Task(
    name="matrix_power",
    family="matmul",
    summary=f"C = A^{POWER} for an n x n matrix A",
    sizes=lambda scale: {"n": _side(scale), "power": POWER},  # the card says its power (the templates read it)
    inputs=(Tensor("A", ("n", "n")),),
    outputs=(Tensor("C", ("n", "n")),),
    flops="4 * n * n * n",  # A^4 by two squarings (A^2, then (A^2)^2): the least work, whatever a kernel does
    baseline=Baseline(
        source=BASELINES.render("matrix_power.cu", power=POWER),
        entry="matrix_power_naive",
        grid=("n",),
        block=(256,),
        args=("A", "C", "n"),
        shared_bytes="2 * n * 4",
    ),
    reference=lambda inputs, sizes: {"C": np.linalg.matrix_power(_f64(inputs["A"]), POWER)},
    generate=_power_inputs,
    check=f"A^{POWER} of a matrix with entries of variance 1/n (the generator), so outputs are about 1/sqrt(n): "
    "rtol as the dtype's, atol 3 x 16 x 2^-24 (sum_tolerance(3)): each of the three products sums n terms of "
    "about 1/n, one unit of sum_tolerance, and carries the previous product's error through A (norm 1 to 2). "
    "Sequential fp32 sums err by 4 x 2^-24 at most for n up to 1024 (tests/suite/tasks/test_dense.py), 12x under; "
    "TF32 (2^-11 relative) or bf16 intermediates (2^-9) err far more on the small outputs",
    tolerance=sum_tolerance(POWER - 1),  # n terms of about 1/n per product: one unit (n x 1/n) per product
    vendor=Vendor(
        "cuBLAS (torch.linalg.matrix_power)", lambda torch, t, sizes: {"C": torch.linalg.matrix_power(t["A"], POWER)}
    ),
    description="Inputs come from a generator scaled by 1/sqrt(n) so powers stay bounded. torch's bf16 "
    "matrix_power rounds each intermediate product to bf16; the task's contract (and the baseline) keeps them "
    "in fp32.",
)


CONTRACTION = "ade,dbec->abc"
"""high_order_contraction: C[a, b, c] = sum over d, e of A[a, d, e] * B[d, b, e, c]."""


def _contraction_sizes(scale: int) -> Sizes:
    """Every tensor holds `scale` elements: a = s and b c = d e = s, with b != c (log2 s is odd at every suite
    scale) and d = c, e = b."""
    side = _side(scale)
    half = side.bit_length() - 1
    small, large = 1 << half // 2, 1 << (half - half // 2)
    return {"a": side, "b": small, "c": large, "d": large, "e": small}


HIGH_ORDER_CONTRACTION = Task(
    name="high_order_contraction",
    family="matmul",
    summary="C[a, b, c] = sum over d, e of A[a, d, e] * B[d, b, e, c]",
    sizes=_contraction_sizes,
    inputs=(Tensor("A", ("a", "d", "e")), Tensor("B", ("d", "b", "e", "c"))),
    outputs=(Tensor("C", ("a", "b", "c")),),
    flops="2 * a * b * c * d * e",
    baseline=Baseline(
        source=BASELINES.render("high_order_contraction.cu"),
        entry="high_order_contraction_naive",
        grid=("cdiv(a * b * c, 256)",),
        block=(256,),
        args=("A", "B", "C", "a", "b", "c", "d", "e"),
    ),
    reference=lambda inputs, sizes: {"C": np.einsum(CONTRACTION, _f64(inputs["A"]), _f64(inputs["B"]))},
    check="sums of d e = 2048 products at most: rtol as the dtype's, atol 16 x 2^-24 x 2048 (sum_tolerance)",
    tolerance=sum_tolerance(2048),
    vendor=Vendor("cuBLAS (torch.einsum)", lambda torch, t, sizes: {"C": torch.einsum(CONTRACTION, t["A"], t["B"])}),
    description="The contracted modes d and e interleave with B's free modes b and c, so as laid out the "
    "contraction is no single GEMM: torch.einsum permutes B first (a transpose, then cuBLAS); a kernel may "
    "instead read B strided. a = s; b, c, d and e are powers of two with b c = d e = s.",
)


TASKS: tuple[Task, ...] = (
    VECTOR_ADD,
    REVERSE_ARRAY,
    MATRIX_COPY,
    MATRIX_TRANSPOSE,
    MATRIX_SCALAR_MUL,
    MATRIX_VECTOR_MUL,
    MATRIX_MUL,
    SQUARE_MATRIX_MUL,
    MATRIX_POWER,
    HIGH_ORDER_CONTRACTION,
)
