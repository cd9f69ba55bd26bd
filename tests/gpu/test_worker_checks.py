"""The GPU worker's pure rules, on any machine: which prefill each launch gets, what a failed check says, how the
helpers' records read as a check, timing statistics and the device memory a card needs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernelforge_tui.cards import load_card
from kernelforge_tui.cards.model import OperatorCard, Tolerance
from kernelforge_tui.gpu.checks import (
    FIRST_RUN,
    SECOND_RUN,
    CompareCounts,
    Fill,
    Prefill,
    WrongLaunch,
    add_exact_output,
    add_float_output,
    add_timings,
    bytes_needed,
    describe,
    fill_for,
    set_check,
    stale_source,
    timed_failure,
    timed_fill,
)
from kernelforge_tui.gpu.statistics import median_settled
from kernelforge_tui.vocabulary.evaluation import EvalResult, SetCheck
from tests.conftest import EXAMPLES

TOL = Tolerance(rtol=1e-5, atol=1e-8)


def test_only_the_first_run_of_each_set_starts_from_the_poison() -> None:
    """The second run and every timed run start from finite values: a kernel that reads its output first shows.
    Timed launches alternate another set's results (plausible, so keeping them is caught) and noise."""
    assert FIRST_RUN.prefill is Prefill.POISON
    assert fill_for(SECOND_RUN, 3) == Fill(Prefill.STALE, 3)
    timed = [timed_fill(i, 3) for i in range(10)]
    assert timed == [Fill(Prefill.STALE, 3), Fill(Prefill.NOISE)] * 5


def test_stale_results_come_from_a_fresh_set_else_the_second_set_else_noise() -> None:
    assert stale_source(["seed_1", "seed_2", "stress:zeros", "fresh-0", "fresh-1"]) == 3
    assert stale_source(["seed_1", "seed_2", "seed_3"]) == 1
    assert stale_source(["seed_1"]) is None
    assert fill_for(Prefill.STALE, None) == Fill(Prefill.NOISE)
    assert timed_fill(0, None) == Fill(Prefill.NOISE)
    assert fill_for(Prefill.POISON, 3) == Fill(Prefill.POISON)


def test_a_prefill_is_named_in_words() -> None:
    names = ["seed_1", "seed_2", "fresh-0"]
    assert describe(Fill(Prefill.STALE, 2), names) == "set fresh-0's reference outputs"
    assert describe(Fill(Prefill.NOISE), names) == "random finite values"
    assert describe(FIRST_RUN, names) == "the NaN poison"


SPEC = OperatorCard.model_validate(
    {
        "name": "two_outputs", "family": "elementwise", "sizes": {"n": 8},
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["n"]}],
        "outputs": [
            {"name": "y", "dtype": "float32", "shape": ["n"], "tolerance": {"rtol": 1e-5, "atol": 1e-8}},
            {"name": "k", "dtype": "int32", "shape": ["n"]},
        ],
        "input_sets": [{"name": "seed_1", "seed": 1}], "reference": {"function": "x"},
    }
)  # fmt: skip


def records(float_words: list[int], int_words: list[int]) -> np.ndarray:
    """One record per output of SPEC (y's CompareResult, k's count and first byte), 8 words each."""
    return np.array([float_words + [0] * (8 - len(float_words)), int_words + [0] * 6], dtype=np.uint64)


def test_a_launchs_records_read_as_one_check_of_every_output() -> None:
    """The helpers' records of one launch, in the card's output order: y's compare counts, k's byte count."""
    passed = set_check(SPEC, "seed_1", FIRST_RUN, records([0, 0, 2**64 - 1], [0, 2**64 - 1]))
    assert passed.ok and passed.numel == 16 and passed.bad == 0
    wrong_k = set_check(SPEC, "seed_1", FIRST_RUN, records([0, 0, 2**64 - 1], [8, 12]))
    assert not wrong_k.ok and wrong_k.first_bad_index == 3 and wrong_k.bad == 2
    assert wrong_k.reason == "k: integer output differs from the reference"
    unwritten = set_check(SPEC, "seed_1", FIRST_RUN, records([8, 0, 0, 0, 0, 8], [0, 2**64 - 1]))
    assert unwritten.reason == "y was never written (all 8 elements still hold the NaN poison)"
    with pytest.raises(ValueError):
        set_check(SPEC, "seed_1", FIRST_RUN, records([0], [0])[:1])


def test_wrong_timed_launches_are_counted_and_named() -> None:
    check = SetCheck(name="seed_1", ok=False, reason="c: 4 of 4 elements outside rtol=1e-05, atol=1e-08")
    names = ["seed_1", "fresh-0"]
    wrong = [WrongLaunch(number=k, fill=timed_fill(k - 1, 1), check=check) for k in range(1, 20, 2)]
    assert timed_failure(wrong, 20, names) == (
        "10 of its 20 timed launches gave a wrong output (launch 1, 3, 5, 7, 9, 11, 13, 15, ...), though every run "
        "before the timing was right; launch 1, started from set fresh-0's reference outputs: c: 4 of 4 elements "
        "outside rtol=1e-05, atol=1e-08"
    )
    one = [WrongLaunch(number=2, fill=timed_fill(1, 1), check=check)]
    assert timed_failure(one, 10, names).startswith(
        "1 of its 10 timed launches gave a wrong output (launch 2), though every run before the timing was right; "
        "launch 2, started from random finite values: "
    )


def test_compare_counts_decode_the_helpers_words() -> None:
    """What the kf_compare helper writes back: bad, nan_out, first_bad, two doubles as their bits, then
    poisoned, inf_out, special."""
    doubles = np.array([0.25, 3.5], dtype=np.float64).view(np.uint64)
    counts = CompareCounts.from_words(np.array([15, 2, 17, *doubles, 3, 4, 5], dtype=np.uint64))
    assert counts == CompareCounts(
        bad=15, first_bad=17, max_abs=0.25, max_ratio=3.5, poisoned=3, nan_out=2, inf_out=4, special=5
    )
    assert counts.outside == 1


def failed(counts: CompareCounts, fill: Fill = FIRST_RUN, dims: tuple[int, ...] = (4, 8)) -> SetCheck:
    check = SetCheck(name="seed_1", ok=True)
    add_float_output(check, "y", dims, TOL, counts, fill)
    assert not check.ok and check.bad == counts.bad
    return check


def test_an_output_left_holding_the_poison_was_never_written() -> None:
    check = failed(CompareCounts(32, 0, 0.0, 0.0, poisoned=32))
    assert check.unwritten == 32 and check.numel == 32
    assert check.reason == "y was never written (all 32 elements still hold the NaN poison)"
    partly = failed(CompareCounts(3, 9, 0.0, 0.0, poisoned=3))
    assert partly.unwritten == 3
    assert partly.reason == "y: 3 of 32 elements never written (still the NaN poison's bits) (first at index 9, row 1)"


def test_nan_the_kernel_computed_is_not_called_unwritten() -> None:
    """NaN everywhere, but not the poison's bits: the kernel wrote it, from the poison or not."""
    for fill in (FIRST_RUN, Fill(Prefill.NOISE)):
        check = failed(CompareCounts(32, 0, 0.0, 0.0, nan_out=32), fill)
        assert check.unwritten == 0
        assert check.reason == "y: 32 of 32 elements NaN where the reference is finite (first at index 0, row 0)"


def test_the_poisons_bits_after_a_finite_prefill_are_a_nan_the_kernel_wrote() -> None:
    """From noise or stale results an unwritten element is not NaN, so a NaN there is one the kernel wrote."""
    check = failed(CompareCounts(32, 9, 0.0, 0.0, poisoned=30, nan_out=2), Fill(Prefill.STALE, 1))
    assert check.unwritten == 0
    assert check.reason == "y: 32 of 32 elements NaN where the reference is finite (first at index 9, row 1)"


def test_infinities_and_missed_specials_are_named_not_called_tolerance_misses() -> None:
    inf = failed(CompareCounts(5, 2, 0.0, 0.0, inf_out=5))
    assert inf.reason == "y: 5 of 32 elements inf where the reference is finite (first at index 2, row 0)"
    special = failed(CompareCounts(4, 8, 0.0, 0.0, special=4), dims=(32,))
    assert special.reason == "y: 4 of 32 elements wrong where the reference is NaN or inf (first at index 8)"


def test_mixed_kinds_are_each_counted() -> None:
    counts = CompareCounts(12, 1, 0.5, 12.0, poisoned=3, nan_out=2, inf_out=1, special=4)
    check = failed(counts, dims=(100,))
    assert check.unwritten == 3
    assert check.reason == (
        "y: 12 of 100 elements wrong: 3 never written (still the NaN poison's bits), 2 NaN where the reference is "
        "finite, 1 inf where the reference is finite, 4 wrong where the reference is NaN or inf, 2 outside "
        "rtol=1e-05, atol=1e-08 (worst 12x the tolerance) (first at index 1)"
    )


def test_values_outside_the_tolerance_are_counted_and_placed() -> None:
    check = SetCheck(name="seed_1", ok=True)
    add_float_output(check, "y", (4, 8), TOL, CompareCounts(0, 2**64 - 1, 1e-9, 0.1), FIRST_RUN)
    assert check.ok and check.max_error_ratio == 0.1 and check.first_bad_index is None
    add_float_output(check, "z", (100,), TOL, CompareCounts(7, 42, 0.5, 12.0), Fill(Prefill.STALE, 1))
    assert not check.ok and check.bad == 7 and check.numel == 132 and check.first_bad_index == 42
    assert check.max_abs_error == 0.5 and check.max_error_ratio == 12.0
    assert (
        check.reason
        == "z: 7 of 100 elements outside rtol=1e-05, atol=1e-08 (worst 12x the tolerance) (first at index 42)"
    )


def test_integer_outputs_must_match_exactly() -> None:
    check = SetCheck(name="seed_1", ok=True)
    add_exact_output(check, "idx", 10, 4, 0, 0)
    assert check.ok and check.numel == 10
    add_exact_output(check, "idx", 10, 4, 6, 13)
    assert not check.ok and check.bad == 1 and check.first_bad_index == 3
    assert check.reason == "idx: integer output differs from the reference"


def test_timings_give_the_speedup_and_the_rates() -> None:
    result = EvalResult(ok=True)
    samples = {"candidate": [10.0] * 19 + [50.0], "baseline": [30.0] * 20}
    add_timings(result, samples, bytes_moved=12_000_000, flops=1_000_000)
    assert result.candidate is not None and result.candidate.median_us == 10.0 and result.candidate.reps == 20
    assert result.speedup == pytest.approx(3.0)
    assert result.achieved_gbps == pytest.approx(1200.0)
    assert result.achieved_tflops == pytest.approx(0.1)


def test_timing_settles_when_the_median_is_known_well_enough() -> None:
    rng = np.random.default_rng(0)
    assert median_settled([100.0 + x for x in rng.normal(0, 0.1, 40)], 0.002)
    assert not median_settled([100.0 + x for x in rng.normal(0, 20, 40)], 0.002)


def test_device_memory_counts_the_first_runs_copy_beside_the_outputs() -> None:
    """Noise is drawn on the GPU into the outputs themselves: no buffer of its own."""
    spec = load_card(EXAMPLES / "cards" / "vector_add_f32").spec
    tensor = 4 * spec.sizes["n"]
    assert bytes_needed(spec, 5, 1000) == 5 * (2 * 2 * tensor + tensor) + 2 * tensor + 1000
    assert math.isclose(bytes_needed(spec, 0, 0) / tensor, 2)
