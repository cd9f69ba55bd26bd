"""A suite task: an operator at every scale and precision it runs at, as operator cards.

Why a declaration and not a directory of cards: 50 tasks x 2 precisions x 4+ scales is hundreds of cards, and what
varies between them is only the sizes and the element type. A task says once what the operator is (its tensors as
formulas over sizes, its FLOP count), what the naive kernel a student would write looks like (`Baseline`, written
with the `T`/`ld`/`cv` prelude so one source serves fp32 and bf16), what is right (a NumPy reference that shares no
code with the baseline), how outputs are checked (`check`, in words, per task), and which vendor library has the
operation. `kernelforge_tui.suite.cards` turns (task, precision, scale) into a card directory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from kernelforge_tui.capture.baselines import CUDA as BASELINE_PIECES
from kernelforge_tui.cards.model import Distribution, Expr, OpFamily, Tolerance
from kernelforge_tui.cuda_files import CudaFiles

Arrays = dict[str, np.ndarray]
Sizes = dict[str, int]
Precision = Literal["float32", "bfloat16"]
PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16")
SHORT: dict[Precision, str] = {"float32": "fp32", "bfloat16": "bf16"}
T = "T"
"""A tensor dtype that is the task's precision (index arrays and counts name their own dtype)."""
SCALES = (2**10, 2**14, 2**18, 2**22)
"""Elements of a task's main data tensor at each scale: 2^10 to 2^22, as MSKernelBench spans them."""


@dataclass(frozen=True)
class Tensor:
    """One input or output: its shape as formulas over the sizes, and its dtype (`T`: the precision)."""

    name: str
    shape: tuple[Expr, ...]
    dtype: str = T
    distribution: Distribution = field(default_factory=Distribution)


BASELINES = CudaFiles("kernelforge_tui.suite.tasks", shared=BASELINE_PIECES)
"""The tasks' baseline kernels, suite/tasks/cuda/*.cu: each is the text after the prelude (capture/cuda/prelude.cuh),
and may include the captured baselines' shared pieces (block_reduce.cuh)."""


@dataclass(frozen=True)
class Baseline:
    """The naive kernel every speedup is measured against: straightforward, correct at every size, not tuned.

    `source` is CUDA after the prelude (`T`, `ld(p, i)` to fp32, `cv(v)` from fp32, `BLOCK` = 256); the plan's
    formulas are over the sizes, as a card's are."""

    source: str
    entry: str
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    args: tuple[str, ...]
    shared_bytes: Expr = 0


@dataclass(frozen=True)
class Vendor:
    """A vendor library's implementation of the task, timed beside ours in the same run (`kernelforge bench`).

    `run(torch, inputs, sizes)` takes the torch module (so nothing here imports torch) and the card's inputs as
    CUDA tensors named as the card names them, and returns the outputs by name (cuBLAS through torch.mm, cuSPARSE
    through torch.sparse, cuFFT through torch.fft, CUB through torch.sort/cumsum, cuDNN through conv)."""

    library: str
    run: Callable[[Any, Mapping[str, Any], Sizes], Mapping[str, Any]]


Reference = Callable[[Arrays, Sizes], Arrays]
Generator = Callable[[np.random.Generator, Sizes, Precision], Arrays]


@dataclass(frozen=True)
class Task:
    """One suite task. `sizes(scale)` maps a scale (elements of the main tensor) to the card's sizes."""

    name: str
    family: OpFamily
    summary: str
    sizes: Callable[[int], Sizes]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    flops: Expr
    baseline: Baseline
    reference: Reference
    """NumPy, float64 (or exact integer) math, sharing nothing with the baseline; returns every output."""
    check: str
    """How the outputs are checked and why that is the right check for this task, in words."""
    generate: Generator | None = None
    """Structured inputs (sparse indices, sample points): drawn from a generator seeded per set."""
    tolerance: Mapping[Precision, Tolerance] = field(default_factory=dict)
    """Per precision; the dtype's default where absent (integer outputs are always exact)."""
    precisions: tuple[Precision, ...] = PRECISIONS
    no_bf16: str = ""
    """Why the task has no bf16 variant, when it has none."""
    scales: tuple[int, ...] = SCALES
    vendor: Vendor | None = None
    """The vendor library's implementation, when one has the operation."""
    bytes: Expr | Mapping[Precision, Expr] | None = None
    """Bytes the operator must move at least (one formula, or one per precision); None: every input read once and
    every output written once."""
    stress_skip: Mapping[str, str] = field(default_factory=dict)
    """Stress sets of the family this task does not run, with why."""
    description: str = ""
    """More than the summary: the data, the sparsity pattern, the layout."""

    def __post_init__(self) -> None:
        problems = []
        if len(self.scales) < 4:
            problems.append(f"{len(self.scales)} scales (at least four)")
        if any(not 2**10 <= s <= 2**22 for s in self.scales):
            problems.append(f"scales {self.scales} outside 2^10..2^22")
        if "bfloat16" not in self.precisions and not self.no_bf16:
            problems.append("no bf16 variant and no `no_bf16` saying why")
        if problems:
            raise ValueError(f"task {self.name}: " + "; ".join(problems))

    def bytes_at(self, precision: Precision) -> Expr | None:
        """The task's byte formula at a precision (None: every tensor once)."""
        return self.bytes.get(precision) if isinstance(self.bytes, Mapping) else self.bytes

    def draw(self, sizes: Sizes, precision: Precision, seed: int) -> Arrays:
        """The generator's inputs for one seed (only for tasks with a generator)."""
        if self.generate is None:
            raise ValueError(f"task {self.name} draws its inputs from distributions")
        return self.generate(np.random.default_rng([seed, 0x5017E]), sizes, precision)
