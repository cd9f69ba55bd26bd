"""Writing a captured variant's card: card.toml, baseline.cu, reference.py and the stored sets, checked on write.

Why the check: a stored set holds the eager outputs the model really produced, and the reference re-runs the op
for fresh and stress sets; a kernel is held to both, so both must agree. The card is written with a float64
reference first; when that disagrees with the eager outputs beyond the card's tolerance, with the captured dtypes;
when neither agrees the variant gets no card, and the reason says by how much they differ.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernelforge_tui.capture import reference
from kernelforge_tui.capture.families import CardPlan, RoundedBeforeSum, RoundedStatistics
from kernelforge_tui.capture.manifest import Step
from kernelforge_tui.cards.directory import MAX_STORED_SET_BYTES, Arrays, Card, draw_inputs, load_card, save_card
from kernelforge_tui.cards.dtypes import FLOATING, NUMPY
from kernelforge_tui.cards.model import (
    BaselineSpec,
    Cost,
    Distribution,
    InputSet,
    OperatorCard,
    OutputSpec,
    Reference,
    StressSpec,
    TensorSpec,
    Tolerance,
)
from kernelforge_tui.errors import KernelForgeError

STRESS_SEED = 1000
SEEDED_SETS = 1
"""Seeded sets (drawn from the fitted distributions, referenced by the torch reference) beside the stored ones."""
PRECISIONS = ("float64", "captured")
ELEMENTWISE_PRECISIONS = ("opmath", *PRECISIONS)
"""An elementwise op's reference tries its opmath first (see `capture.reference`): what the operator computes."""
ROUNDED = ("stepwise", "stepwise-opmath", "captured")
"""The precisions whose intermediate results are the captured calls' dtypes, as eager stores them."""
PRECISION_WORDS = {
    "float64": "float64",
    "stepwise": "float64 a call, each result in its captured dtype",
    "stepwise-opmath": "float32 a call (the operators' opmath), each result in its captured dtype",
    "opmath": "float32 (the operator's opmath)",
    "captured": "the captured dtypes",
}


def fit(arrays: list[np.ndarray], dtype: str) -> tuple[Distribution, str]:
    """A distribution like the captured values of one input, and a note when it departs from them: non-negative
    values (variances, post-ReLU activations, weights around 1) are drawn uniformly between their extremes, others
    from a normal of their mean and spread; a constant tensor is drawn within 25% of its value (a card whose weight is
    constant in every set cannot tell a kernel that ignores it)."""
    values = np.concatenate([a.astype(np.float64).ravel() for a in arrays]) if arrays else np.zeros(1)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return Distribution(), "no finite captured values: drawn from normal(0, 1)"
    lo, hi = float(finite.min()), float(finite.max())
    if dtype not in FLOATING:
        return Distribution(kind="randint", low=lo, high=hi + 1), ""
    if hi == lo:
        spread = max(abs(lo) * 0.25, 1e-3)
        note = (
            f"constant {lo:g} in the capture: drawn from {lo - spread:g}..{lo + spread:g} so a kernel ignoring it fails"
        )
        if lo >= 0:
            return Distribution(kind="uniform", low=max(0.0, lo - spread), high=lo + spread), note
        return Distribution(kind="uniform", low=lo - spread, high=lo + spread), note
    if lo >= 0:
        return Distribution(kind="uniform", low=lo, high=hi), ""
    return Distribution(kind="normal", mean=float(finite.mean()), std=float(finite.std())), ""


@dataclass(frozen=True)
class Written:
    card: Card
    precision: str
    stored: int
    notes: list[str]


class CardRefused(KernelForgeError):
    """The card could not be made consistent (its reference disagrees with the eager outputs)."""


def disagreement(eager: np.ndarray, reference: np.ndarray, tolerance: Tolerance) -> str | None:
    """Where `reference` disagrees with the eager outputs beyond `tolerance`, with the numbers: how many elements,
    the worst one (farthest beyond what it is allowed: its index, eager's and the reference's values, the difference
    and the allowance) and the largest difference; None when they agree."""
    ok = tolerance.accepts(eager, reference)
    if ok.all():
        return None
    o = eager.astype(np.float64)
    e = reference.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(o - e)
        allowed = tolerance.atol + tolerance.rtol * np.abs(e)
        beyond = np.where(ok, -np.inf, np.nan_to_num(diff - allowed, nan=np.inf, posinf=np.inf))
    worst = np.unravel_index(int(np.argmax(beyond)), ok.shape)
    finite = np.isfinite(diff)
    largest = f"; largest difference {float(diff[finite].max()):.3g}" if finite.any() else ""
    return (
        f"{int((~ok).sum())} of {ok.size} elements outside |eager - reference| <= {tolerance.atol:.3g} + "
        f"{tolerance.rtol:.3g} * |reference|; worst at {[int(k) for k in worst]}: eager {float(o[worst]):.6g}, "
        f"reference {float(e[worst]):.6g}, difference {float(diff[worst]):.3g}, allowed {float(allowed[worst]):.3g}"
        f"{largest}"
    )


def _mismatch(card: Card, sets: dict[str, tuple[Arrays, Arrays]]) -> str | None:
    """Where the card's reference disagrees with the stored eager outputs, in words; None when it agrees."""
    for set_name, (inputs, outputs) in sets.items():
        ref = card.reference(inputs)
        for spec in card.spec.outputs:
            problem = disagreement(outputs[spec.name], ref[spec.name], spec.effective_tolerance())
            if problem is not None:
                return f"set {set_name}: {spec.name}: {problem}"
    return None


def _extent(distribution: Distribution) -> float:
    """The largest magnitude a seeded set is likely to draw from `distribution` (4 spreads for a normal)."""
    if distribution.kind == "normal":
        return abs(distribution.mean) + 4 * distribution.std
    return max(abs(distribution.low), abs(distribution.high))


def statistics_tolerance(
    base: Tolerance, rounded: RoundedStatistics, samples: list[Arrays], inputs: dict[str, Distribution]
) -> tuple[Tolerance, str]:
    """The card's tolerance for an op whose eager kernel rounds its per-group statistics (`RoundedStatistics`: CUDA's
    group norm in bf16/fp16), and the note that says why: base.atol plus unit * (max |beta| + (1 + unit) *
    max |gamma| * max |mean| / std over the groups), on the captured values and on what the seeded sets draw (the
    fitted distributions), so that eager's outputs on either agree with the exact math."""
    ratio = 0.0
    for sample in samples:
        if "x" in sample:  # [n, c, h, w]: a (sample, group) is a contiguous span
            x = sample["x"].astype(np.float64)
            groups = x.reshape(x.shape[0] * rounded.groups, -1)
            spread = np.sqrt(groups.var(axis=1) + rounded.eps)
            ratio = max(ratio, float(np.max(np.abs(groups.mean(axis=1)) / spread)))
    dist = inputs["x"]  # a seeded group's mean strays from the distribution's by up to 4 spreads / sqrt(span)
    noise = 4 / rounded.span**0.5
    if dist.kind == "normal" and dist.std > 0:
        ratio = max(ratio, abs(dist.mean) / dist.std + noise)
    elif dist.kind == "uniform" and dist.high > dist.low:
        ratio = max(ratio, abs(dist.low + dist.high) / 2 / ((dist.high - dist.low) / 12**0.5) + noise)

    def largest(name: str) -> float:
        captured = [float(np.max(np.abs(s[name].astype(np.float64)))) for s in samples if name in s]
        return max([_extent(inputs[name]), *captured])

    beta, gamma = largest("beta"), largest("gamma")
    extra = rounded.unit * (beta + (1 + rounded.unit) * gamma * ratio)
    tolerance = Tolerance(rtol=base.rtol, atol=base.atol + extra)
    note = (
        f"atol {tolerance.atol:.3g} = {base.atol:g} + {rounded.unit:g} * (max |beta| {beta:.3g} + max |gamma| "
        f"{gamma:.3g} * max |mean| / std {ratio:.3g}): eager on CUDA rounds each group's mean and rstd to the "
        "tensors' dtype before normalising, which moves y by up to that where beta cancels the normalised term"
    )
    return tolerance, note


def sum_tolerance(
    base: Tolerance, rounded: RoundedBeforeSum, samples: list[Arrays], inputs: dict[str, Distribution]
) -> tuple[Tolerance, str]:
    """The card's tolerance for a batch norm rounded before a residual add (`RoundedBeforeSum`), and the note that
    says why: base.atol plus one rounding step, 2 * unit * the largest |bn(x)|, on the captured values (exactly, per
    channel) and on what the seeded sets draw (the fitted distributions' extents, the smallest variance)."""
    largest = 0.0
    shape = [1, 1, 1]
    shape[rounded.channel_axis] = -1
    for sample in samples:
        if all(name in sample for name in ("x", "w", "b", "mean", "var")):
            w, b, mean, var = (sample[n].astype(np.float64).reshape(shape) for n in ("w", "b", "mean", "var"))
            x = sample["x"].astype(np.float64)
            largest = max(largest, float(np.max(np.abs((x - mean) * w / np.sqrt(var + rounded.eps) + b))))
    drawn_var = inputs["var"]
    smallest_var = drawn_var.low if drawn_var.kind != "normal" else drawn_var.mean - 4 * drawn_var.std
    drawn = (_extent(inputs["x"]) + _extent(inputs["mean"])) * _extent(inputs["w"])
    drawn = drawn / np.sqrt(max(smallest_var, 0.0) + rounded.eps) + _extent(inputs["b"])
    largest = max(largest, float(drawn))
    tolerance = Tolerance(rtol=base.rtol, atol=base.atol + 2 * rounded.unit * largest)
    note = (
        f"atol {tolerance.atol:.3g} = {base.atol:g} + one rounding step (2 * {rounded.unit:g}) of the largest "
        f"|batch_norm(x)| {largest:.3g}: eager rounds the norm to the tensors' dtype before the residual add, and two "
        "correct roundings of it may differ by that step, which stays whole where the sum cancels"
    )
    return tolerance, note


def write_card(
    root: Path,
    name: str,
    plan: CardPlan,
    steps: list[Step],
    samples: list[Arrays],
    description: str,
    max_set_bytes: int = MAX_STORED_SET_BYTES,
) -> Written:
    """Write the card directory `root` (replacing it) and check its reference against the stored eager outputs;
    CardRefused when no precision of the reference agrees (the directory is removed then)."""
    notes: list[str] = []
    inputs: list[TensorSpec] = []
    for t in plan.tensors:
        if t.role != "input":
            continue
        distribution, note = fit([s[t.name] for s in samples if t.name in s], t.meta.dtype)
        inputs.append(TensorSpec(name=t.name, dtype=t.meta.dtype, shape=t.dims, distribution=distribution))
        if note:
            notes.append(f"{t.name}: {note}")
    tolerance = plan.tolerance
    distributions = {t.name: t.distribution for t in inputs}
    if plan.rounded_statistics is not None and tolerance is not None:
        tolerance, note = statistics_tolerance(tolerance, plan.rounded_statistics, samples, distributions)
        notes.append(note)
    if plan.rounded_before_sum is not None and tolerance is not None:
        tolerance, note = sum_tolerance(tolerance, plan.rounded_before_sum, samples, distributions)
        notes.append(note)
    outputs = [
        OutputSpec(name=t.name, dtype=t.meta.dtype, shape=t.dims, tolerance=tolerance)
        for t in plan.tensors
        if t.role == "output"
    ]
    stored: dict[str, tuple[Arrays, Arrays]] = {}
    for k, sample in enumerate(samples):
        total = sum(a.nbytes for a in sample.values())
        if total > max_set_bytes or len(sample) != len(plan.tensors):
            continue
        ins = {t.name: sample[t.name] for t in inputs}
        outs = {t.name: sample[t.name].astype(NUMPY[t.dtype], copy=False) for t in outputs}
        stored[f"captured_{k}"] = (ins, outs)
    if len(stored) < len(samples):
        notes.append(
            f"{len(samples) - len(stored)} sampled call(s) over {max_set_bytes / 2**20:g} MiB not stored: seeded "
            "sets drawn from the captured statistics stand in"
        )
    sets = [InputSet(name=set_name, file=f"{set_name}.npz") for set_name in stored]
    sets += [InputSet(name=f"seed_{k + 1}", seed=k + 1) for k in range(SEEDED_SETS + (0 if stored else 1))]
    spec = OperatorCard(
        name=name,
        family=plan.family,
        description=description + ("\n" + "\n".join(notes) if notes else ""),
        sizes=plan.sizes,
        inputs=inputs,
        outputs=outputs,
        cost=Cost(flops=plan.flops, bytes=plan.bytes_formula()),
        input_sets=sets,
        reference=Reference(kind="numpy", function="reference.py:reference"),
        baseline=BaselineSpec(source="baseline.cu", plan=plan.plan),
        stress=StressSpec(seed=STRESS_SEED, skip=plan.stress_skip),
        chain=plan.chain,
        call=plan.call,
    )
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "baseline.cu").write_text(plan.source)
    bindings = plan.bindings()
    replayed = plan.replay or steps
    problems: list[str] = []
    for precision in plan.precisions or (ELEMENTWISE_PRECISIONS if plan.family == "elementwise" else PRECISIONS):
        (root / "reference.py").write_text(reference.source(name, replayed, bindings, precision, plan.input_places()))
        if plan.chain is not None:  # a kernel must round between the calls where the reference does
            rounded = precision in ROUNDED
            spec = spec.model_copy(update={"chain": plan.chain.model_copy(update={"rounded": rounded})})
            (root / "baseline.cu").write_text(plan.rounded_source if rounded and plan.rounded_source else plan.source)
        card = save_card(spec, root, stored)
        try:
            problem = _mismatch(card, stored)
            if not stored:  # nothing to compare with: at least the reference must run, in this precision
                card.reference(draw_inputs(spec, 1))
        except Exception as exc:  # the reference cannot run in this precision (an op without a float64 kernel)
            problem = f"the reference raised {type(exc).__name__}: {exc}"
        if problem is None:
            return Written(load_card(root), precision, len(stored), notes)
        problems.append(f"in {PRECISION_WORDS[precision]}: {problem}")
    shutil.rmtree(root, ignore_errors=True)
    raise CardRefused(f"the torch reference does not reproduce the eager outputs ({'; '.join(problems)})")
