"""Suite tasks over dense vectors and matrices: copies, transposes, products, contractions.

Each baseline is what a student writes first: a thread per output element, loads straight from global memory,
no tiling, no vectors; each reference is NumPy in float64 and shares nothing with the baseline.
"""

from __future__ import annotations

import numpy as np

from kernelforge_tui.suite.task import Baseline, Task, Tensor, Vendor


def _f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


VECTOR_ADD = Task(
    name="vector_add",
    family="elementwise",
    summary="c = a + b over n elements",
    sizes=lambda scale: {"n": scale},
    inputs=(Tensor("a", ("n",)), Tensor("b", ("n",))),
    outputs=(Tensor("c", ("n",)),),
    flops="n",
    baseline=Baseline(
        source="""
extern "C" __global__ void vector_add_naive(const T* a, const T* b, T* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = cv(ld(a, i) + ld(b, i));
    }
}
""",
        entry="vector_add_naive",
        grid=("cdiv(n, 256)",),
        block=(256,),
        args=("a", "b", "c", "n"),
    ),
    reference=lambda inputs, sizes: {"c": _f64(inputs["a"]) + _f64(inputs["b"])},
    check="the dtype's tolerance: one rounding of an exact sum",
    vendor=Vendor("PyTorch (elementwise)", lambda torch, t, sizes: {"c": torch.add(t["a"], t["b"])}),
)


TASKS: tuple[Task, ...] = (VECTOR_ADD,)
