"""The GPU worker's own code on a CPU machine, over a host-memory stand-in for pycuda.driver
(tests/support/fakes/cuda.py).

The GPU tests run the same kernels on the H200; here the order of prefills, checks and timing, and the
public launch API that profiling uses, are exercised on every CI run.
"""

from __future__ import annotations

import operator
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.cards import load_card, plan_for_kernel, save_card, stress
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.dtypes import NUMPY
from kernelforge_tui.cards.model import DEFAULT_TOLERANCE
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.config import EvalSettings
from kernelforge_tui.gpu.device import GpuDevice
from kernelforge_tui.gpu.protocol import Evaluate, KernelRef, LoadCard
from kernelforge_tui.gpu.worker import Worker
from kernelforge_tui.vocabulary.evaluation import EvalResult
from tests.conftest import EXAMPLES
from tests.support.fakes import cuda

N = 1000
VECTOR_ADD = EXAMPLES / "cards" / "vector_add_f32"
PLAN = EXAMPLES / "kernels" / "cheats" / "vector_add_f32" / "wrong_answer.cu"  # its plan: a, b, c, n


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    cuda.reset()
    package = types.ModuleType("pycuda")
    package.driver = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", cuda)
    monkeypatch.setattr(cuda, "KERNELS", dict(KERNELS))
    yield


@pytest.fixture
def card(tmp_path: Path) -> Card:
    """vector_add_f32 with 1000 elements: three seeded sets and a NumPy reference."""
    source = load_card(VECTOR_ADD)
    (tmp_path / "card").mkdir()
    shutil.copy(source.root / "baseline.cu", tmp_path / "card" / "baseline.cu")
    return save_card(source.spec.model_copy(update={"sizes": {"n": N}}), tmp_path / "card", {})


def vectors(a: int, b: int, c: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return cuda.view(a, np.float32, n), cuda.view(b, np.float32, n), cuda.view(c, np.float32, n)


def honest() -> cuda.Kernel:
    def run(a: int, b: int, c: int, n: np.int32) -> None:
        x, y, out = vectors(a, b, c, int(n))
        out[:] = x + y

    return run


def reads_output() -> cuda.Kernel:
    """Adds a + b to whatever c holds, a NaN counting as nothing: right from the poison only."""

    def run(a: int, b: int, c: int, n: np.int32) -> None:
        x, y, out = vectors(a, b, c, int(n))
        out[:] = np.where(np.isnan(out), np.float32(0), out) + x + y

    return run


def keeps_output_after(honest_launches: int) -> Callable[[], cuda.Kernel]:
    """Honest for its first launches, then keeps any output that is not NaN (skips the work when timed)."""

    def make() -> cuda.Kernel:
        launches = 0

        def run(a: int, b: int, c: int, n: np.int32) -> None:
            nonlocal launches
            launches += 1
            x, y, out = vectors(a, b, c, int(n))
            keep = ~np.isnan(out) if launches > honest_launches else np.zeros(int(n), dtype=bool)
            out[:] = np.where(keep, out, x + y)

        return run

    return make


def never_writes() -> cuda.Kernel:
    return lambda a, b, c, n: None


def computes_nan() -> cuda.Kernel:
    """Writes CUDA's canonical NaN (0x7fffffff, as 0/0 gives on the GPU) everywhere: written, not the poison."""

    def run(a: int, b: int, c: int, n: np.int32) -> None:
        cuda.view(c, np.uint32, int(n))[:] = 0x7FFFFFFF

    return run


def zeroes_non_finite() -> cuda.Kernel:
    """a + b with NaN and inf replaced by 0: right on ordinary data, wrong where the reference is NaN or inf."""

    def run(a: int, b: int, c: int, n: np.int32) -> None:
        x, y, out = vectors(a, b, c, int(n))
        with np.errstate(over="ignore", invalid="ignore"):
            total = x + y
        out[:] = np.where(np.isfinite(total), total, np.float32(0))

    return run


def half_then_inf() -> cuda.Kernel:
    """Leaves the first 100 elements unwritten, writes inf into the next 10, then a + b."""

    def run(a: int, b: int, c: int, n: np.int32) -> None:
        x, y, out = vectors(a, b, c, int(n))
        out[100:110] = np.inf
        out[110:] = (x + y)[110:]

    return run


HONEST_LAUNCHES = 13
"""The launches before the timing on the 1000-element card: 9 sets (the card's, fresh and stress), the second run
and 3 warm-ups. A cheat honest for these is timed from launch 14 on (timed launch 1)."""


def skips_timed(skipped: Callable[[int], bool]) -> Callable[[], cuda.Kernel]:
    """Honest for HONEST_LAUNCHES, then writes nothing on the timed launches (numbered from 1) `skipped` picks: a
    __device__ launch counter's cheat."""

    def make() -> cuda.Kernel:
        launches = 0

        def run(a: int, b: int, c: int, n: np.int32) -> None:
            nonlocal launches
            launches += 1
            if launches <= HONEST_LAUNCHES or not skipped(launches - HONEST_LAUNCHES):
                x, y, out = vectors(a, b, c, int(n))
                out[:] = x + y

        return run

    return make


def honest_with_a_counter() -> cuda.Kernel:
    """Keeps a launch counter and takes another (equally right) path on odd launches: state, but no cheat."""
    launches = 0

    def run(a: int, b: int, c: int, n: np.int32) -> None:
        nonlocal launches
        launches += 1
        x, y, out = vectors(a, b, c, int(n))
        out[:] = x + y if launches % 2 else y + x

    return run


PREFILLS: list[np.ndarray] = []
"""What the output held as each launch of `records_prefills` started."""


def records_prefills() -> cuda.Kernel:
    def run(a: int, b: int, c: int, n: np.int32) -> None:
        x, y, out = vectors(a, b, c, int(n))
        PREFILLS.append(out.copy())
        out[:] = x + y

    return run


def modifies_input_when_timed() -> cuda.Kernel:
    """Honest, but from its first timed launch on it also bumps b[0] after using it (its output stays right)."""
    launches = 0

    def run(a: int, b: int, c: int, n: np.int32) -> None:
        nonlocal launches
        launches += 1
        x, y, out = vectors(a, b, c, int(n))
        out[:] = x + y
        if launches > HONEST_LAUNCHES:
            y[0] += 1

    return run


KERNELS: dict[str, Callable[[], cuda.Kernel]] = {
    "baseline": honest,
    "honest": honest,
    "reads_output": reads_output,
    "keeps_output_when_timed": keeps_output_after(HONEST_LAUNCHES),
    "never_writes": never_writes,
    "computes_nan": computes_nan,
    "zeroes_non_finite": zeroes_non_finite,
    "half_then_inf": half_then_inf,
    "skips_every_other": skips_timed(lambda timed: timed % 2 == 1),
    "skips_every_third": skips_timed(lambda timed: timed % 3 == 1),
    **{f"skips_launch_{k}": skips_timed(partial(operator.eq, k)) for k in (1, 2, 10, 11, 20)},
    "honest_with_a_counter": honest_with_a_counter,
    "records_prefills": records_prefills,
    "modifies_input_when_timed": modifies_input_when_timed,
}


def ref(card: Card, name: str) -> KernelRef:
    return KernelRef(cubin=Path(f"/cubins/{name}.cubin"), launch=resolve(plan_for_kernel(PLAN), card.spec))


def evaluate(card: Card, name: str, fresh_seeds: int = 2) -> EvalResult:
    worker = Worker()
    # A 4 KB flush: the fake's memory is host RAM (model_copy skips the floor a real flush must keep).
    settings = EvalSettings(fresh_seeds=fresh_seeds).model_copy(update={"flush_bytes": 4096})
    loaded = worker.load_card(
        LoadCard(card_dir=card.root, helpers_cubin=Path("/cubins/helpers.cubin"), settings=settings, fresh_seed=99)
    )
    stress_sets = [planned.label for planned in stress.running(card.spec)]
    assert loaded.sets == ["seed_1", "seed_2", "seed_3"] + [f"fresh-{k}" for k in range(fresh_seeds)] + stress_sets
    return worker.evaluate(Evaluate(candidate=ref(card, name), baseline=ref(card, "baseline"), bytes_moved=12 * N))


def test_an_honest_kernel_passes_every_check_and_is_timed(fake_cuda: None, card: Card) -> None:
    result = evaluate(card, "honest")
    assert result.ok, result.reason
    stress_sets = [planned.label for planned in stress.running(card.spec)]
    sets = ["seed_1", "seed_2", "seed_3", "fresh-0", "fresh-1", *stress_sets, "seed_1 (second run)"]
    assert [check.name for check in result.checks] == sets
    assert all(check.ok and check.numel == N for check in result.checks)
    assert result.deterministic
    assert result.candidate is not None and result.candidate.reps >= 20 and result.speedup == pytest.approx(1.0)


def test_never_written_outputs_still_show_as_the_poison(fake_cuda: None, card: Card) -> None:
    result = evaluate(card, "never_writes")
    assert not result.ok and result.failure == "mismatch"
    assert result.reason == "set seed_1: c was never written (all 1000 elements still hold the NaN poison)"


def test_nan_the_kernel_computed_is_not_called_never_written(fake_cuda: None, card: Card) -> None:
    result = evaluate(card, "computes_nan")
    assert not result.ok and result.failure == "mismatch"
    assert result.reason == "set seed_1: c: 1000 of 1000 elements NaN where the reference is finite (first at index 0)"
    assert result.checks[0].unwritten == 0


def test_each_kind_of_wrong_element_is_counted(fake_cuda: None, card: Card) -> None:
    result = evaluate(card, "half_then_inf")
    assert result.reason == (
        "set seed_1: c: 110 of 1000 elements wrong: 100 never written (still the NaN poison's bits), "
        "10 inf where the reference is finite (first at index 0)"
    )
    assert result.checks[0].unwritten == 100


def test_a_finite_output_where_the_reference_is_nan_or_inf_is_named(fake_cuda: None, card: Card) -> None:
    """Right on the card's sets, the fresh ones and stress:large; stress:max-finite (a + b overflows to inf)
    catches it."""
    result = evaluate(card, "zeroes_non_finite")
    assert not result.ok and result.failure == "mismatch"
    assert [check.name for check in result.checks if not check.ok] == ["stress:max-finite"]
    assert result.reason == (
        "set stress:max-finite: c: 502 of 1000 elements wrong where the reference is NaN or inf (first at index 2)"
    )


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_the_poison_as_written_is_what_the_compare_counts_as_never_written(fake_cuda: None, dtype: str) -> None:
    """GpuDevice.poison writes POISON_BITS (8-byte types as a repeated 16-bit pattern) and compare passes the
    same bits to kf_compare: every element of a poisoned output counts as never written."""
    device = GpuDevice(cuda)
    device.load_helpers(Path("/cubins/helpers.cubin"))
    numel = 64
    itemsize = NUMPY[dtype].itemsize
    out, reference = device.alloc(numel * itemsize), device.alloc(numel * itemsize)
    device.poison(int(out), numel * itemsize, dtype)
    cuda.memcpy_htod(reference, np.ones(numel, dtype=NUMPY[dtype]))
    counts = device.compare(int(out), reference, numel, dtype, DEFAULT_TOLERANCE[dtype])
    assert counts.bad == counts.poisoned == numel


def test_a_kernel_that_reads_its_output_first_fails_the_second_run(fake_cuda: None, card: Card) -> None:
    """Right from the NaN poison on every set; the second run starts from a fresh set's results."""
    result = evaluate(card, "reads_output")
    assert not result.ok and result.failure == "mismatch"
    assert all(check.ok for check in result.checks[:5])
    assert result.checks[-1].name == "seed_1 (second run)" and not result.checks[-1].ok
    assert result.reason.startswith(
        "the second run on the same inputs, started from set fresh-0's reference outputs instead of the NaN poison"
    )


def test_without_fresh_sets_the_second_run_starts_from_the_second_sets_results(fake_cuda: None, card: Card) -> None:
    result = evaluate(card, "reads_output", fresh_seeds=0)
    assert not result.ok and "started from set seed_2's reference outputs" in result.reason


def test_a_kernel_that_keeps_its_output_when_timed_fails_the_timed_check(fake_cuda: None, card: Card) -> None:
    """Honest for 13 launches (9 sets: the card's, fresh and stress; the second run; 3 warm-ups), then it keeps
    whatever is not NaN: every timed launch of the first batch is wrong, and the timing stops there."""
    result = evaluate(card, "keeps_output_when_timed")
    assert not result.ok and result.failure == "cheat"
    assert all(check.ok for check in result.checks)
    assert result.reason.startswith(
        "10 of its 10 timed launches gave a wrong output (launch 1, 2, 3, 4, 5, 6, 7, 8, ...), though every run "
        "before the timing was right; launch 1, started from set fresh-0's reference outputs: c: 1000 of 1000 "
        "elements outside rtol=1e-05"
    )


def test_the_public_launch_api_launches_once_on_one_set(fake_cuda: None, card: Card) -> None:
    """What ncu.launch does: one input set, poisoned outputs, one launch."""
    worker = Worker()
    which = card.spec.input_sets[1]
    worker.load_input_set(card, which)
    outputs = worker.state.outputs if worker.state is not None else {}
    inputs, _ = card.input_set(which)
    worker.launch_once(worker.load_kernel(ref(card, "never_writes")))
    assert np.isnan(cuda.view(outputs["c"].ptr, np.float32, N)).all()
    worker.launch_once(worker.load_kernel(ref(card, "honest")))
    assert np.array_equal(cuda.view(outputs["c"].ptr, np.float32, N), inputs["a"] + inputs["b"])
    worker.close()


# -- every timed launch is checked (issue 30) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "launches"),
    [("skips_every_other", "1, 3, 5, 7, 9"), ("skips_every_third", "1, 4, 7, 10")],
)
def test_a_kernel_that_skips_timed_launches_by_a_counter_is_caught(
    fake_cuda: None, card: Card, name: str, launches: str
) -> None:
    """Right on every set, the second run and the last timed launch (20: the one checked before), wrong on the
    timed launches its counter skips: each of those is checked, and the first batch's are named."""
    result = evaluate(card, name)
    assert not result.ok and result.failure == "cheat"
    assert all(check.ok for check in result.checks)
    skipped = len(launches.split(", "))
    assert result.reason.startswith(
        f"{skipped} of its 10 timed launches gave a wrong output (launch {launches}), though every run before the "
        "timing was right; launch 1, started from set fresh-0's reference outputs: c: 1000 of 1000 elements outside"
    )
    assert result.candidate is None and result.speedup is None


@pytest.mark.parametrize("launch", [1, 2, 10, 11, 20])
def test_no_timed_launch_goes_unchecked(fake_cuda: None, card: Card, launch: int) -> None:
    """One skipped timed launch, wherever it falls (first or last of a batch, the second batch), is caught; the
    prefill it kept is named (odd launches start from another set's results, even ones from fresh noise)."""
    result = evaluate(card, f"skips_launch_{launch}")
    assert not result.ok and result.failure == "cheat", result.reason
    started = "set fresh-0's reference outputs" if launch % 2 else "random finite values"
    assert result.reason.startswith(f"1 of its {10 * ((launch + 9) // 10)} timed launches gave a wrong output "
                                    f"(launch {launch}),")  # fmt: skip
    assert f"launch {launch}, started from {started}: c: " in result.reason


def test_an_honest_kernel_with_a_launch_counter_passes(fake_cuda: None, card: Card) -> None:
    result = evaluate(card, "honest_with_a_counter")
    assert result.ok, result.reason
    assert result.candidate is not None and result.candidate.reps >= 20


def test_each_timed_launch_starts_from_a_prefill_of_its_own(fake_cuda: None, card: Card) -> None:
    """Timed launches alternate another set's results with noise drawn afresh for each launch: no two noise
    prefills are alike, none is the poison, and the stale one is fresh-0's references."""
    PREFILLS.clear()
    result = evaluate(card, "records_prefills")
    assert result.ok, result.reason
    timed = PREFILLS[HONEST_LAUNCHES:]
    assert len(timed) == 20
    noise, stale = timed[1::2], timed[0::2]
    assert all(np.isfinite(fill).all() and np.abs(fill).max() <= 4 for fill in noise)
    assert len({fill.tobytes() for fill in noise}) == len(noise)
    fresh, _ = fresh_set(card)
    assert all(np.array_equal(fill, fresh["c"]) for fill in stale)


def fresh_set(card: Card) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """fresh-0 as the worker draws it (seed 99, the one `evaluate` loads with): (references, inputs)."""
    inputs = card.draw(99)
    return card.reference(inputs), inputs


def test_an_input_changed_while_timed_is_caught_after_the_timing(fake_cuda: None, card: Card) -> None:
    result = evaluate(card, "modifies_input_when_timed")
    assert not result.ok and result.failure == "cheat" and result.fatal
    assert result.reason.startswith("while it was timed, it modified its input 'b' (")
