"""The suite's tasks as cards: every task at every precision and scale is a valid card whose plan resolves, every
baseline builds with nvcc (the plan's arguments checked against the kernel's parameters), and every reference runs
on the drawn inputs at the smallest scale. Per-task checks against independent computations live beside the task
modules' own tests (tests/suite/tasks/)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards.dtypes import FLOATING, NUMPY
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import TASKS, select, task
from kernelforge_tui.suite.task import SCALES, Baseline, Task, Tensor

VARIANTS = [(t, p) for t in TASKS.values() for p in t.precisions]
VARIANT_IDS = [f"{t.name}-{p}" for t, p in VARIANTS]


@pytest.mark.parametrize(("case", "precision"), VARIANTS, ids=VARIANT_IDS)
def test_every_scale_is_a_valid_card_whose_plan_resolves(case: Task, precision: str) -> None:
    names = set()
    for scale in case.scales:
        spec = cards.spec(case, precision, scale)  # type: ignore[arg-type]
        names.add(spec.name)
        assert spec.baseline is not None
        launch = resolve(spec.baseline.plan, spec)
        assert launch.threads_per_block >= 1
        assert spec.flops() > 0 and spec.bytes_moved() > 0, "the score weighs by operations; the roofline needs bytes"
        main = max(spec.inputs + spec.outputs, key=lambda t: t.numel(spec.sizes))
        assert scale <= main.numel(spec.sizes) <= 4 * scale, (
            f"scale {scale}: the largest tensor has {main.numel(spec.sizes)}"
        )
    assert len(names) == len(case.scales), "every scale is its own card"


@pytest.mark.parametrize(("case", "precision"), VARIANTS, ids=VARIANT_IDS)
def test_every_baseline_builds_with_nvcc_for_every_scale(
    case: Task, precision: str, tmp_path: Path, cubin_cache: Path
) -> None:
    """One source serves every scale (sizes are arguments); the plan's arguments of each scale are checked against
    the kernel's parameters by the builder's source check."""
    builder = Builder(cache_dir=cubin_cache, work_dir=tmp_path)
    source = cards.baseline_source(case, precision)  # type: ignore[arg-type]

    async def build_all() -> list[str]:
        problems = []
        for scale in case.scales:
            spec = cards.spec(case, precision, scale)  # type: ignore[arg-type]
            assert spec.baseline is not None
            result = await builder.build(source, case.baseline.entry, resolve(spec.baseline.plan, spec).args)
            if not result.ok:
                problems.append(f"scale {scale}: {result.failure}: {result.log[-2000:]}")
        return problems

    assert asyncio.run(build_all()) == []


@pytest.mark.parametrize(("case", "precision"), VARIANTS, ids=VARIANT_IDS)
def test_every_reference_runs_on_drawn_inputs(case: Task, precision: str, tmp_path: Path) -> None:
    card = cards.write(case, precision, min(case.scales), tmp_path)  # type: ignore[arg-type]
    inputs, outputs = card.input_set(card.spec.input_sets[0])
    for spec in card.spec.inputs:
        assert inputs[spec.name].dtype == NUMPY[spec.dtype] and inputs[spec.name].shape == spec.dims(card.spec.sizes)
    for spec in card.spec.outputs:
        out = outputs[spec.name]
        assert out.dtype == NUMPY[spec.dtype] and out.shape == spec.dims(card.spec.sizes)
        if spec.dtype in FLOATING:
            assert np.isfinite(out.astype(np.float64)).all(), f"{spec.name}: ordinary inputs give finite outputs"
    again, _ = card.input_set(card.spec.input_sets[0])
    other, _ = card.input_set(card.spec.input_sets[1])
    assert all(np.array_equal(again[k], v) for k, v in inputs.items()), "a seed draws the same set"
    assert any(not np.array_equal(other[k], v) for k, v in inputs.items()), "two seeds draw different sets"
    for name, _, stressed in card.stress_sets():  # the family's hard inputs go through the reference too
        assert all(stressed[o.name].shape == o.dims(card.spec.sizes) for o in card.spec.outputs), name


def test_the_suite_has_fifty_tasks_with_a_check_written_down() -> None:
    pending = 50 - len(TASKS)
    assert all(t.check.strip() for t in TASKS.values())
    assert all(t.no_bf16 for t in TASKS.values() if "bfloat16" not in t.precisions)
    assert pending >= 0


def test_a_task_refuses_too_few_scales_and_an_unexplained_missing_precision() -> None:
    base = task("vector_add")
    with pytest.raises(ValueError, match="3 scales"):
        Task(**{**base.__dict__, "scales": SCALES[:3]})
    with pytest.raises(ValueError, match="no `no_bf16` saying why"):
        Task(**{**base.__dict__, "precisions": ("float32",)})
    with pytest.raises(ValueError, match=r"outside 2\^10..2\^22"):
        Task(**{**base.__dict__, "scales": (*SCALES[:3], 2**23)})


def test_cards_refuse_a_scale_or_precision_the_task_does_not_run() -> None:
    only_fp32 = Task(**{**task("vector_add").__dict__, "precisions": ("float32",), "no_bf16": "because"})
    with pytest.raises(ValueError, match="no bfloat16 variant: because"):
        cards.spec(only_fp32, "bfloat16", SCALES[0])
    with pytest.raises(ValueError, match="not 2048"):
        cards.spec(only_fp32, "float32", 2048)


def test_card_names_and_written_files(tmp_path: Path) -> None:
    card = cards.write(task("vector_add"), "bfloat16", 2**18, tmp_path)
    assert card.root == tmp_path / "vector_add_bf16_s18"
    assert card.spec.sizes == {"n": 2**18} and card.spec.bytes_moved() == 3 * 2 * 2**18
    assert "typedef __nv_bfloat16 T;" in card.baseline_source()
    assert 'task("vector_add")' in (card.root / "reference.py").read_text()


def test_a_generator_draws_structured_inputs_through_the_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task with a generator: every seeded set comes from it (here: a permutation), not from distributions."""

    def permutation(rng: np.random.Generator, sizes: dict[str, int], precision: str) -> dict[str, np.ndarray]:
        return {"a": rng.permutation(sizes["n"]).astype(NUMPY[precision]), "b": np.ones(sizes["n"], NUMPY[precision])}

    permuted = Task(**{**task("vector_add").__dict__, "generate": permutation})
    monkeypatch.setitem(TASKS, "vector_add", permuted)  # the card's reference.py looks the task up by name
    card = cards.write(permuted, "float32", 2**10, tmp_path)
    inputs, outputs = card.input_set(card.spec.input_sets[0])
    assert sorted(inputs["a"].tolist()) == list(range(2**10)) and (outputs["c"] == inputs["a"] + 1).all()


def test_select_by_glob() -> None:
    assert [t.name for t in select(["vector_*"])] == ["vector_add"]
    assert len(select([])) == len(TASKS)
    with pytest.raises(KeyError, match="matches no task"):
        select(["nothing_like_it"])
    with pytest.raises(KeyError, match="no suite task"):
        task("nope")


def test_a_tensor_defaults_to_the_precision() -> None:
    assert Tensor("x", ("n",)).dtype == "T" and Baseline("", "k", (1,), (1,), ()).shared_bytes == 0


def test_bytes_may_be_given_per_precision() -> None:
    """A lower bound that depends on the element size (ELL's entries) is one formula per precision."""
    per = Task(**{**task("vector_add").__dict__, "bytes": {"float32": "12 * n", "bfloat16": "6 * n"}})
    assert cards.spec(per, "float32", 2**10).bytes_moved() == 12 * 2**10
    assert cards.spec(per, "bfloat16", 2**10).bytes_moved() == 6 * 2**10
    assert (
        cards.spec(task("spmv_ell"), "float32", 2**18).bytes_moved()
        > cards.spec(task("spmv_ell"), "bfloat16", 2**18).bytes_moved()
    )
