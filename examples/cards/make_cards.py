"""(Re)write the example operator cards under examples/cards/, reproducibly.

Run from the repository root: `.venv/bin/python examples/cards/make_cards.py`. Each card directory is
rebuilt from scratch: card.toml, the stored .npz input sets (small cards only: large inputs are drawn
from seeds on the fly), baseline.cu, and candidates/ with hand-written kernels and their plans. The
kernel sources live once under examples/kernels/<family>/ and are copied here; the plans are written
from this file. Stored sets are drawn from fixed seeds and written with fixed timestamps, so running
the script twice changes nothing.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kernelforge_tui.cards.model import (
    BaselineSpec,
    Cost,
    Distribution,
    InputSet,
    LaunchPlan,
    OperatorCard,
    OutputSpec,
    Reference,
    StressSpec,
    TensorSpec,
    Tolerance,
)
from kernelforge_tui.cards.directory import Arrays, Card, draw_inputs, save_card, to_toml
from kernelforge_tui.cards.stress import plan

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent / "kernels"
STRESS = StressSpec(seed=1000)
"""Every example card declares its stress sets; none skips one."""


@dataclass(frozen=True)
class Candidate:
    """A hand-written kernel copied into the card's candidates/ with the plan written beside it."""

    source: Path
    plan: LaunchPlan
    note: str


@dataclass(frozen=True)
class Example:
    spec: OperatorCard
    baseline: Path
    candidates: list[Candidate]
    stored_seeds: dict[str, int] = field(default_factory=dict)
    """Stored sets: set name -> the seed its inputs are drawn from (references computed here)."""


# --- vector add -------------------------------------------------------------------------------------


def vector_add_f32() -> Example:
    n = "n"
    spec = OperatorCard(
        name="vector_add_f32",
        family="elementwise",
        description=(
            "c = a + b in fp32, n = 2**25 (128 MiB per tensor, about 100 us at the copy ceiling on an H200):\n"
            "the card the harness-overhead benchmark uses. The reference adds in fp32 like any kernel must,\n"
            "so results are bit-identical; the default fp32 tolerance (rtol 1e-5, atol 1e-8) applies.\n"
            "Cost: 2 reads + 1 write of 4 bytes, 1 flop per element."
        ),
        sizes={"n": 2**25},
        inputs=[
            TensorSpec(name="a", dtype="float32", shape=[n], distribution=Distribution(kind="normal")),
            TensorSpec(name="b", dtype="float32", shape=[n], distribution=Distribution(kind="normal")),
        ],
        outputs=[OutputSpec(name="c", dtype="float32", shape=[n], tolerance=Tolerance(rtol=1e-5, atol=1e-8))],
        cost=Cost(flops="n", bytes="12 * n"),
        input_sets=[InputSet(name="seed_1", seed=1), InputSet(name="seed_2", seed=2), InputSet(name="seed_3", seed=3)],
        reference=Reference(kind="numpy", function="vector_add"),
        stress=STRESS,
        baseline=BaselineSpec(
            source="baseline.cu",
            plan=LaunchPlan(entry="vector_add_naive", grid=["cdiv(n, 256)"], block=[256], args=["a", "b", "c", "n"]),
        ),
    )
    vec4 = Candidate(
        KERNELS / "vector_add" / "vec4_grid_stride.cu",
        LaunchPlan(
            entry="vector_add_vec4",
            grid=["min(cdiv(n, 4 * 256), 132 * 8)"],
            block=[256],
            args=["a", "b", "c", "n:i64"],
        ),
        "float4 accesses, grid-stride loop over one wave of resident blocks (132 SMs x 8 blocks of 256)",
    )
    return Example(spec, KERNELS / "vector_add" / "baseline.cu", [vec4])


# --- softmax ----------------------------------------------------------------------------------------

SOFTMAX_TOLERANCE_NOTE = {
    "float32": (
        "Tolerance (fp32): y is about 1/cols on average, so the default atol of 1e-8 would be a third of a\n"
        "typical value at cols = 32768 and would let small outputs be garbage. atol is set to about 1% of\n"
        "rtol * (1/cols), so the relative term decides for all but the tiniest outputs. rtol stays 1e-5:\n"
        "fp32 kernels (fast __expf included: a few 1e-6 for these arguments; reordered sums: ~1e-7) pass,\n"
        "exp or sums computed in fp16 (errors ~1e-3) fail."
    ),
    "bfloat16": (
        "Tolerance (bf16): rtol 1.6e-2 as PyTorch's assert_close, which absorbs a 1-ulp difference in the\n"
        "final bf16 rounding (2**-8) plus fp16-grade internal math. atol is 1e-8 instead of the default\n"
        "1e-5: with y about 1/cols (3e-5 at cols = 32768) an atol of 1e-5 would accept wrong values."
    ),
}


def softmax(dtype: str, rows: int, cols: int, name: str, stored: bool) -> Example:
    short = "f32" if dtype == "float32" else "bf16"
    big = cols >= 4096
    # atol about 1% of rtol / cols for fp32 (see the note); bf16 needs only to stay well below 1/cols.
    atol = (1e-11 if big else 1e-10) if dtype == "float32" else 1e-8
    rtol = 1e-5 if dtype == "float32" else 1.6e-2
    sets = (
        [InputSet(name="captured_0", file="captured_0.npz"), InputSet(name="captured_1", file="captured_1.npz")]
        if stored
        else []
    )
    sets += (
        [InputSet(name="seed_1", seed=1)]
        if stored
        else [InputSet(name="seed_1", seed=1), InputSet(name="seed_2", seed=2)]
    )
    elem = 4 if dtype == "float32" else 2
    spec = OperatorCard(
        name=name,
        family="softmax",
        description=(
            f"y = softmax(x) over the last axis of x[rows, cols], {dtype} in and out"
            + ("" if dtype == "float32" else ", fp32 math")
            + f"; rows = {rows}, cols = {cols}"
            + (" (odd, so rows are not all 16-byte aligned and vector kernels need a tail).\n" if not big else ".\n")
            + "x ~ normal(0, 2), like attention logits. Cost: x read once, y written once; 5 flops per\n"
            "element (max, subtract, exp, add, scale).\n" + SOFTMAX_TOLERANCE_NOTE[dtype]
        ),
        sizes={"rows": rows, "cols": cols},
        inputs=[
            TensorSpec(name="x", dtype=dtype, shape=["rows", "cols"], distribution=Distribution(kind="normal", std=2.0))
        ],
        outputs=[OutputSpec(name="y", dtype=dtype, shape=["rows", "cols"], tolerance=Tolerance(rtol=rtol, atol=atol))],
        cost=Cost(flops="5 * rows * cols", bytes=f"{2 * elem} * rows * cols"),
        input_sets=sets,
        reference=Reference(kind="numpy", function="softmax"),
        stress=STRESS,
        baseline=BaselineSpec(
            source="baseline.cu",
            plan=LaunchPlan(
                entry=f"softmax_naive_{short}", grid=["cdiv(rows, 32)"], block=[32], args=["x", "y", "rows", "cols"]
            ),
        ),
    )
    threads = 1024 if big else 128
    candidate = Candidate(
        KERNELS / "softmax" / f"block_row_{short}.cu",
        LaunchPlan(entry=f"softmax_block_row_{short}", grid=["rows"], block=[threads], args=["x", "y", "rows", "cols"]),
        f"one block of {threads} per row, row in registers (one read of x), 16-byte accesses, warp-shuffle reductions",
    )
    return Example(
        spec,
        KERNELS / "softmax" / f"baseline_{short}.cu",
        [candidate],
        {"captured_0": 100, "captured_1": 101} if stored else {},
    )


# --- rms_norm ---------------------------------------------------------------------------------------


def rms_norm(rows: int, cols: int, name: str, stored: bool) -> Example:
    big = cols * rows >= 2**20
    sets = (
        [
            InputSet(name="captured_0", file="captured_0.npz"),
            InputSet(name="captured_1", file="captured_1.npz"),
            InputSet(name="seed_1", seed=1),
        ]
        if stored
        else [InputSet(name="seed_1", seed=1), InputSet(name="seed_2", seed=2)]
    )
    spec = OperatorCard(
        name=name,
        family="rms_norm",
        description=(
            "y = x * rsqrt(mean(x^2 over the row) + 1e-6) * w, bf16 in and out, fp32 math; "
            f"x[rows, cols], w[cols], rows = {rows}, cols = {cols}"
            + ("" if big else " (odd cols: most rows are not 16-byte aligned and vector kernels need a tail)")
            + ".\nx ~ normal(0, 1), w ~ uniform(0.5, 1.5). Cost: x and w read once, y written once; 4 flops per\n"
            "element (square, add, two multiplies). Tolerance: bf16 defaults (rtol 1.6e-2 as PyTorch's\n"
            "assert_close, 2**-8 is one bf16 ulp; atol 1e-5 only matters for outputs near zero)."
        ),
        sizes={"rows": rows, "cols": cols},
        inputs=[
            TensorSpec(name="x", dtype="bfloat16", shape=["rows", "cols"], distribution=Distribution(kind="normal")),
            TensorSpec(
                name="w", dtype="bfloat16", shape=["cols"], distribution=Distribution(kind="uniform", low=0.5, high=1.5)
            ),
        ],
        outputs=[
            OutputSpec(name="y", dtype="bfloat16", shape=["rows", "cols"], tolerance=Tolerance(rtol=1.6e-2, atol=1e-5))
        ],
        cost=Cost(flops="4 * rows * cols", bytes="4 * rows * cols + 2 * cols"),
        input_sets=sets,
        reference=Reference(kind="numpy", function="rms_norm"),
        stress=STRESS,
        baseline=BaselineSpec(
            source="baseline.cu",
            plan=LaunchPlan(
                entry="rms_norm_naive", grid=["cdiv(rows, 128)"], block=[128], args=["x", "w", "y", "rows", "cols"]
            ),
        ),
    )
    candidate = Candidate(
        KERNELS / "rms_norm" / "block_row.cu",
        LaunchPlan(entry="rms_norm_block_row", grid=["rows"], block=[128], args=["x", "w", "y", "rows", "cols"]),
        "one block of 128 per row, row in registers (one read of x), 16-byte accesses, warp-shuffle sum; small "
        "blocks keep many rows in flight per SM",
    )
    return Example(
        spec,
        KERNELS / "rms_norm" / "baseline.cu",
        [candidate],
        {"captured_0": 100, "captured_1": 101} if stored else {},
    )


# --- layer_norm -------------------------------------------------------------------------------------

LAYER_NORM_TOLERANCE = {
    "float32": Tolerance(rtol=1e-5, atol=1e-5),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-3),
}
"""Why these atols: the description of each card says (atol sets how large a mean its kernels must handle)."""


def layer_norm(dtype: str, rows: int, cols: int, name: str) -> Example:
    short = "f32" if dtype == "float32" else "bf16"
    elem = 4 if dtype == "float32" else 2
    tolerance = LAYER_NORM_TOLERANCE[dtype]
    spec = OperatorCard(
        name=name,
        family="layer_norm",
        description=(
            f"y = (x - mean) * rsqrt(var + 1e-5) * w + b over the row, {dtype} in and out, fp32 math; x[rows, cols],\n"
            f"w[cols], b[cols], rows = {rows}, cols = {cols} (odd: most rows are not 16-byte aligned, vector\n"
            "kernels need a tail). x ~ normal(0, 1), w ~ uniform(0.5, 1.5), b ~ uniform(-0.5, 0.5). Cost: x, w, b\n"
            f"read once, y written once; 8 flops per element. Tolerance: rtol {tolerance.rtol:g}, atol "
            f"{tolerance.atol:g}. Outputs\nare about 1 in size, and near 0 where b cancels the normalised term, "
            "where only atol applies: an fp32\nkernel's mean is off by 2^-24 * mean / spread of the spread, "
            "which every output carries, so atol sets\nhow large a mean the kernels must handle (the large-mean "
            "stress set): "
            + (
                "1e-5 = rtol at |y| = 1 (mean / spread up\nto ~30), while fp16 math errs by 1e-3."
                if dtype == "float32"
                else "1e-3 = half a bf16 step at |y| = 0.25\n(mean / spread up to ~300, as 300 +- 1 is in bf16), "
                "where PyTorch's 1e-5 fails every fp32 kernel."
            )
        ),
        sizes={"rows": rows, "cols": cols},
        inputs=[
            TensorSpec(name="x", dtype=dtype, shape=["rows", "cols"], distribution=Distribution(kind="normal")),
            TensorSpec(
                name="w", dtype=dtype, shape=["cols"], distribution=Distribution(kind="uniform", low=0.5, high=1.5)
            ),
            TensorSpec(
                name="b", dtype=dtype, shape=["cols"], distribution=Distribution(kind="uniform", low=-0.5, high=0.5)
            ),
        ],
        outputs=[OutputSpec(name="y", dtype=dtype, shape=["rows", "cols"], tolerance=tolerance)],
        cost=Cost(flops="8 * rows * cols", bytes=f"{2 * elem} * rows * cols + {2 * elem} * cols"),
        input_sets=[
            InputSet(name="captured_0", file="captured_0.npz"),
            InputSet(name="captured_1", file="captured_1.npz"),
            InputSet(name="seed_1", seed=1),
        ],
        reference=Reference(kind="numpy", function="layer_norm"),
        stress=STRESS,
        baseline=BaselineSpec(
            source="baseline.cu",
            plan=LaunchPlan(
                entry=f"layer_norm_naive_{short}",
                grid=["cdiv(rows, 32)"],
                block=[32],
                args=["x", "w", "b", "y", "rows", "cols"],
            ),
        ),
    )
    candidate = Candidate(
        KERNELS / "layer_norm" / "block_row.cu",
        LaunchPlan(
            entry=f"layer_norm_block_row_{short}", grid=["rows"], block=[128], args=["x", "w", "b", "y", "rows", "cols"]
        ),
        "one block of 128 per row, row in registers (one read of x), mean then centred sum of squares",
    )
    return Example(spec, KERNELS / "layer_norm" / "baseline.cu", [candidate], {"captured_0": 100, "captured_1": 101})


def examples() -> list[Example]:
    return [
        vector_add_f32(),
        softmax("float32", 4096, 32768, "softmax_f32_4096x32768", stored=False),
        softmax("bfloat16", 4096, 32768, "softmax_bf16_4096x32768", stored=False),
        softmax("float32", 21, 1003, "softmax_f32_small", stored=True),
        softmax("bfloat16", 21, 1003, "softmax_bf16_small", stored=True),
        rms_norm(16384, 4096, "rms_norm_bf16_16384x4096", stored=False),
        rms_norm(13, 2051, "rms_norm_bf16_small", stored=True),
        layer_norm("float32", 19, 1027, "layer_norm_f32_small"),
        layer_norm("bfloat16", 19, 1027, "layer_norm_bf16_small"),
    ]


def plan_toml(plan: LaunchPlan, note: str) -> str:
    return f"# {note}\n" + to_toml(plan.model_dump(mode="json", exclude_defaults=True))


def write(example: Example, cards_dir: Path = HERE) -> Card:
    """Rebuild one card directory from scratch."""
    root = cards_dir / example.spec.name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    stored: dict[str, tuple[Arrays, Arrays]] = {}
    for set_name, seed in example.stored_seeds.items():
        inputs = draw_inputs(example.spec, seed)
        stored[set_name] = (inputs, Card(spec=example.spec, root=root).reference(inputs))
    shutil.copyfile(example.baseline, root / "baseline.cu")
    candidates = root / "candidates"
    candidates.mkdir()
    for candidate in example.candidates:
        shutil.copyfile(candidate.source, candidates / candidate.source.name)
        (candidates / candidate.source.name).with_suffix(".plan.toml").write_text(
            plan_toml(candidate.plan, candidate.note)
        )
    return save_card(example.spec, root, stored)


def main() -> None:
    for example in examples():
        card = write(example)
        spec = card.spec
        print(
            f"{spec.name:28} sizes={dict(spec.sizes)} bytes={spec.bytes_moved():,} flops={spec.flops():,} "
            f"sets={len(spec.input_sets)}"
        )
        for planned in plan(spec):
            print(f"    {planned.label}" + (f" (skipped: {planned.skipped})" if planned.skipped else ""))


if __name__ == "__main__":
    main()
