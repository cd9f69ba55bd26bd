"""A card's host sets are made side by side, in order, bounded by the CPUs and the free memory."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from kernelforge_tui.cards import CardError, load_card
from kernelforge_tui.cards import directory as card_store
from kernelforge_tui.cards.directory import Arrays, Card, make_side_by_side, side_by_side
from tests.conftest import EXAMPLES

GIB = 1 << 30


@pytest.fixture
def many_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four CPUs and a terabyte free, whatever this machine has."""
    monkeypatch.setattr(card_store.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(card_store, "available_memory", lambda: 1 << 40)


def test_the_sets_made_at_once_are_bounded_by_the_cpus_and_the_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(card_store.os, "cpu_count", lambda: 16)
    assert side_by_side(8, GIB, None) == 8  # no memory figure: one a CPU, no more than there are sets
    assert side_by_side(32, GIB, None) == 16
    assert side_by_side(8, GIB, 100 * GIB) == (50 - 8) // card_store.SET_MEMORY_FACTOR  # half, less the 8 sets
    assert side_by_side(8, GIB, 16 * GIB) == 1  # never none
    monkeypatch.setattr(card_store.os, "cpu_count", lambda: None)
    assert side_by_side(8, 1, None) == 1


def test_sets_are_made_side_by_side_and_come_back_in_order(many_cpus: None) -> None:
    meeting = threading.Barrier(3)

    def meets(k: int) -> int:
        meeting.wait(timeout=20)  # one after another, the first maker would wait alone and break the barrier
        return k

    makers = [lambda k=k: meets(k) for k in range(3)] + [lambda: 3]
    assert make_side_by_side(makers, set_bytes=1) == [0, 1, 2, 3]


def test_a_set_that_fails_to_be_made_raises_its_error_and_the_sets_not_begun_are_not_made(many_cpus: None) -> None:
    made: list[str] = []
    gate, second_begun = threading.Event(), threading.Event()

    def broken() -> str:
        second_begun.wait(timeout=30)  # the error comes while the other thread is making a set
        raise CardError(Path("card.toml"), "reference.function", "it returned None", "return a dict")

    def slow(name: str) -> str:
        if name == "second":
            second_begun.set()
        gate.wait(timeout=3)  # both threads stay busy while the error is raised and the rest cancelled
        made.append(name)
        return name

    later = [lambda k=k: slow(f"later {k}") for k in range(4)]
    makers = [broken, lambda: slow("second"), lambda: slow("third"), *later]
    with pytest.raises(CardError, match="it returned None"):
        make_side_by_side(makers, set_bytes=1, at_once=2)
    # The set begun beside the error is made; the freed thread may have begun the third before the rest were
    # cancelled (a race between it and the raising thread), and then either may end first (both wait out the gate's
    # timeout); no later set is begun.
    assert "second" in made and set(made) <= {"second", "third"}, made


def same(a: Arrays, b: Arrays) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def test_stress_makers_draw_the_base_once_and_make_the_same_sets_in_any_order(
    many_cpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = load_card(EXAMPLES / "cards" / "layer_norm_bf16_small")
    expected = list(card.stress_sets())
    draws: list[int] = []
    draw = Card.draw

    def counted(self: Card, seed: int) -> Arrays:
        draws.append(seed)
        return draw(self, seed)

    monkeypatch.setattr(Card, "draw", counted)
    makers = card.stress_makers()
    assert [label for label, _ in makers] == [label for label, _, _ in expected] and len(makers) > 2
    made = make_side_by_side([make for _, make in reversed(makers)], card.spec.set_bytes())
    assert draws == [card.spec.stress.seed]
    for (inputs, outputs), (_, want_inputs, want_outputs) in zip(reversed(made), expected, strict=True):
        assert same(inputs, want_inputs) and same(outputs, want_outputs)
