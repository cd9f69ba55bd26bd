"""A task at one precision and scale, as an operator card directory the whole product reads.

The card is an ordinary one (card.toml, baseline.cu, reference.py): the search (`kernelforge optimize`), the GPU
worker, the TUI and `kernelforge eval` need nothing suite-specific. Its reference.py imports the task from this
package, so the reference is the suite's own NumPy code (never a copy that could drift), and a task with
structured inputs draws every seeded, fresh and stress set through the same file.
"""

from __future__ import annotations

from pathlib import Path

from kernelforge_tui.capture.baselines import prelude
from kernelforge_tui.cards.directory import Card, save_card
from kernelforge_tui.cards.dtypes import FLOATING
from kernelforge_tui.cards.model import (
    BaselineSpec,
    InputSet,
    LaunchPlan,
    OperatorCard,
    OutputSpec,
    Reference,
    StressSpec,
    TensorSpec,
)
from kernelforge_tui.suite.task import SHORT, Precision, T, Task, Tensor

SEEDS = (1, 2)
"""The seeded input sets of every suite card (the worker adds fresh ones and the family's stress sets)."""
STRESS_SEED = 1000

REFERENCE = '''"""Reference of suite task {name} ({precision}, scale 2^{log}), written by kernelforge_tui.suite:
the task's own NumPy reference{draws}. Edit the task in kernelforge_tui/suite/tasks/, not this file."""

from kernelforge_tui.suite.registry import task

TASK = task("{name}")


def reference(inputs, sizes):
    return TASK.reference(inputs, sizes)


def inputs(sizes, seed):
    return TASK.draw(sizes, "{precision}", seed)
'''


def card_name(task: Task, precision: Precision, scale: int) -> str:
    """`spmv_csr_bf16_s18`: task, precision, log2 of the scale."""
    return f"{task.name}_{SHORT[precision]}_s{scale.bit_length() - 1}"


def _tensor(tensor: Tensor, precision: Precision) -> dict[str, object]:
    return {
        "name": tensor.name,
        "dtype": precision if tensor.dtype == T else tensor.dtype,
        "shape": list(tensor.shape),
        "distribution": tensor.distribution,
    }


def spec(task: Task, precision: Precision, scale: int, *, beyond: bool = False) -> OperatorCard:
    """The card of a task at one precision and scale (validated like any card.toml). `beyond`: a power-of-two scale
    outside the task's list is allowed (a benchmark's goal shape, e.g. 2^26), and the card says its check and
    tolerances were set for the task's own scales."""
    if precision not in task.precisions:
        raise ValueError(f"task {task.name} has no {precision} variant: {task.no_bf16}")
    outside = scale not in task.scales
    if outside and not (beyond and scale > 0 and scale & (scale - 1) == 0):
        raise ValueError(f"task {task.name} runs at scales {list(task.scales)}, not {scale}")
    sizes = task.sizes(scale)
    inputs = [TensorSpec.model_validate(_tensor(t, precision)) for t in task.inputs]
    outputs = []
    for out in task.outputs:
        fields = _tensor(out, precision)
        floating = fields["dtype"] in FLOATING
        outputs.append(
            OutputSpec.model_validate({**fields, "tolerance": task.tolerance.get(precision) if floating else None})
        )
    moved = sum(t.nbytes(sizes) for t in [*inputs, *outputs])
    b = task.baseline
    note = (
        f"Written at scale 2^{_log2(scale)}, beyond the task's scales (2^{_log2(min(task.scales))}.."
        f"2^{_log2(max(task.scales))}): its check and tolerances were set for those."
        if outside
        else ""
    )
    described = "\n".join(filter(None, (task.summary, task.description, f"Check: {task.check}", note)))
    return OperatorCard(
        name=card_name(task, precision, scale),
        family=task.family,
        description=described,
        sizes=sizes,
        inputs=inputs,
        outputs=outputs,
        cost={"flops": task.flops, "bytes": moved if task.bytes_at(precision) is None else task.bytes_at(precision)},
        input_sets=[InputSet(name=f"seed_{s}", seed=s) for s in SEEDS],
        reference=Reference(
            kind="numpy",
            function="reference.py:reference",
            inputs="reference.py:inputs" if task.generate is not None else None,
        ),
        baseline=BaselineSpec(
            plan=LaunchPlan(
                entry=b.entry, grid=list(b.grid), block=list(b.block), shared_bytes=b.shared_bytes, args=list(b.args)
            )
        ),
        stress=StressSpec(seed=STRESS_SEED, skip=dict(task.stress_skip)),
    )


def _log2(scale: int) -> int:
    return scale.bit_length() - 1


def baseline_source(task: Task, precision: Precision) -> str:
    """The baseline's CUDA: the dtype prelude, then the task's kernel."""
    return prelude(precision, f"{task.name}: {task.summary}", author="the suite") + task.baseline.source


def write(task: Task, precision: Precision, scale: int, parent: Path, *, beyond: bool = False) -> Card:
    """Write the card directory `parent/<card name>` and load it back (`beyond`: as `spec` says)."""
    card = spec(task, precision, scale, beyond=beyond)
    root = parent / card.name
    root.mkdir(parents=True, exist_ok=True)
    (root / "baseline.cu").write_text(baseline_source(task, precision))
    draws = " and its input generator (structured inputs)" if task.generate is not None else ""
    (root / "reference.py").write_text(
        REFERENCE.format(name=task.name, precision=precision, log=_log2(scale), draws=draws)
    )
    return save_card(card, root, {})
