"""The tree's statistics and the MCTS strategy's rules on small trees whose numbers are worked out by hand."""

from __future__ import annotations

import math

import pytest

from kernelforge_tui.engine.strategies import STRATEGIES, Strategy, UnknownStrategy, make_strategy
from kernelforge_tui.engine.strategies.mcts import Mcts
from kernelforge_tui.engine.tree import Tree, TreeSettings
from kernelforge_tui.vocabulary.nodes import FailureKind, NodeStatus

LN2, LN3 = math.log(2), math.log(3)


def tree(**settings: float) -> Tree:
    """A root (the baseline, measured at 1.0x) under plain UCT settings unless overridden."""
    base: dict[str, float] = {"exploration": 1.0, "widening_k": 1.0, "widening_alpha": 0.5, "max_weight": 0.0,
                              "failure_reward": -1.0, "prune_after": 100, "improvement_epsilon": 0.0}  # fmt: skip
    t = Tree(TreeSettings.model_validate(base | settings))
    t.add(1, None)
    t.finish(1, NodeStatus.TIMED, 1.0)
    return t


def child(t: Tree, node_id: int, parent: int, speedup: float | None, failure: str | None = None) -> None:
    t.add(node_id, parent, {"id": node_id})
    if failure is not None:
        t.finish(node_id, NodeStatus.FAILED, None, FailureKind(failure))
    elif speedup is not None:
        t.finish(node_id, NodeStatus.TIMED, speedup)


def test_reward_is_log_speedup_and_backs_up_to_the_root() -> None:
    t = tree()
    child(t, 2, 1, 2.0)
    child(t, 3, 2, 3.0)
    assert t[3].value == pytest.approx(LN3)
    assert t[2].visits == 2 and t[2].value == pytest.approx(LN2 + LN3)
    assert t.root.visits == 3 and t.root.value == pytest.approx(0 + LN2 + LN3)
    assert t.root.best == pytest.approx(LN3)


def test_failures_count_as_visits_with_the_failure_reward() -> None:
    t = tree()
    child(t, 2, 1, None, failure="compile")
    assert t[2].visits == 1 and t[2].value == -1.0
    assert t.root.visits == 2 and t.root.value == -1.0
    assert [n.id for n in t.failed_children(1)] == [2]


def test_uct_values_by_hand() -> None:
    # root: visits 3 (itself, 2, 3); child 2 at 2x, child 3 at 0.5x; c = 1, pure mean.
    t = tree()
    mcts = Mcts(t)
    child(t, 2, 1, 2.0)
    child(t, 3, 1, 0.5)
    explore = math.sqrt(math.log(3) / 1)  # 1.04815
    assert mcts.uct(t[2], t.root) == pytest.approx(LN2 + explore)  # 1.74130
    assert mcts.uct(t[3], t.root) == pytest.approx(-LN2 + explore)  # 0.35500
    assert mcts.uct(t[2], t.root) == pytest.approx(1.741294, abs=1e-6)  # ln 2 + sqrt(ln 3)
    # root may have ceil(sqrt(3)) = 2 children: full, so selection descends to the better child.
    assert mcts.allowed_children(t.root) == 2
    assert mcts.select() == 2


def test_q_mixes_mean_and_best() -> None:
    t = tree(max_weight=0.5)
    mcts = Mcts(t)
    child(t, 2, 1, 2.0)
    child(t, 3, 2, 1.0)  # node 2: mean (ln2 + 0) / 2, best ln2
    assert mcts.q(t[2]) == pytest.approx(0.5 * LN2 / 2 + 0.5 * LN2)
    explore = math.sqrt(math.log(3) / 2)
    assert mcts.uct(t[2], t.root) == pytest.approx(0.75 * LN2 + explore)


def test_unvisited_child_is_infinite_but_never_selected_while_in_flight() -> None:
    t = tree()
    mcts = Mcts(t)
    t.add(2, 1)
    assert mcts.uct(t[2], t.root) == math.inf
    assert mcts.select() is None  # root full (1 child allowed at 1 visit), child in flight


@pytest.mark.parametrize(("visits", "allowed"), [(0, 2), (1, 2), (2, 3), (4, 4), (5, 5), (9, 6), (16, 8)])
def test_progressive_widening_k2_alpha_half(visits: int, allowed: int) -> None:
    t = tree(widening_k=2.0, widening_alpha=0.5)
    mcts = Mcts(t)
    t.root.visits = visits
    assert mcts.allowed_children(t.root) == allowed  # ceil(2 * max(1, visits) ** 0.5)


def test_widening_grows_with_visits_then_expands_the_root_again() -> None:
    t = tree()  # k = 1, alpha = 0.5
    mcts = Mcts(t)
    assert mcts.select() == 1 and mcts.expansion_size(1) == 1
    child(t, 2, 1, 2.0)  # root visits 2 -> 2 children allowed
    assert mcts.select() == 1
    child(t, 3, 1, 1.5)  # root visits 3 -> ceil(1.73) = 2: full; descend to the best UCT child
    assert mcts.select() == 2
    child(t, 4, 2, 1.0)  # root visits 4: still 2 children allowed
    # node 2: (ln 2 + 0) / 2 + sqrt(ln 4 / 2) = 1.1791; node 3: ln 1.5 + sqrt(ln 4 / 1) = 1.5829
    assert mcts.uct(t[2], t.root) == pytest.approx(1.179128, abs=1e-6)
    assert mcts.uct(t[3], t.root) == pytest.approx(1.582875, abs=1e-6)
    assert mcts.select() == 3


def test_exhausted_and_failed_nodes_are_not_expanded() -> None:
    t = tree(widening_k=2.0)
    mcts = Mcts(t)
    child(t, 2, 1, None, failure="mismatch")
    t.root.exhausted = True
    assert mcts.select() is None
    assert not t.may_expand(2)


def test_stagnant_subtree_is_pruned_and_skipped() -> None:
    t = tree(prune_after=3, widening_k=10.0)
    mcts = Mcts(t)
    child(t, 2, 1, 1.5)  # node 2: best ln 1.5 at visit 1
    child(t, 3, 1, 1.1)
    assert not t[2].pruned
    child(t, 4, 2, 1.2)
    child(t, 5, 2, 1.0)
    pruned: list[int] = []
    t.add(6, 2)
    pruned = t.finish(6, NodeStatus.TIMED, 1.3)  # node 2 at 4 visits, best unchanged since visit 1: 4 - 1 = 3
    assert pruned == [2] and t[2].pruned
    t.root.exhausted = True
    assert mcts.select() == 3  # node 2 and its subtree are skipped; node 3 may widen
    assert not t.root.pruned  # the root is never pruned


def test_improvement_resets_stagnation() -> None:
    t = tree(prune_after=3, widening_k=10.0)
    child(t, 2, 1, 1.5)
    child(t, 3, 2, 1.0)
    child(t, 4, 2, 2.0)  # improvement at visit 3
    child(t, 5, 2, 1.0)
    assert t[2].visits == 4 and t[2].visits_at_best == 3 and not t[2].pruned


def test_ban_excludes_a_subtree() -> None:
    t = tree()
    mcts = Mcts(t)
    child(t, 2, 1, 2.0)
    child(t, 3, 1, 0.5)
    assert mcts.select() == 2
    t.ban(2)
    assert mcts.select() == 3
    assert not t.may_expand(2)
    t.ban(2, False)
    assert mcts.select() == 2


def test_pin_restricts_selection_to_the_subtree() -> None:
    t = tree(widening_k=3.0)  # the root could take more children
    mcts = Mcts(t)
    child(t, 2, 1, 2.0)
    child(t, 3, 1, 0.5)
    assert mcts.select() == 1
    t.pin(3)
    assert mcts.select() == 3
    child(t, 4, 3, 1.0)
    child(t, 5, 3, 1.0)
    child(t, 6, 3, 1.0)  # node 3 at 4 visits: ceil(3 * 2) = 6 children allowed
    assert mcts.select() == 3
    t[3].exhausted = True
    assert mcts.select() in {4, 5, 6}
    t.pin(3, False)
    assert mcts.select() == 1


def test_a_pin_reopens_the_pruned_path_to_its_node_and_keeps_it_open() -> None:
    t = tree(prune_after=2, widening_k=1.0)
    mcts = Mcts(t)
    child(t, 2, 1, 2.0)
    child(t, 3, 2, 1.0)
    child(t, 4, 2, 1.0)  # node 2: 3 visits, best at its first: pruned
    assert t[2].pruned and mcts.select() == 1
    assert t.pin(3) == [2]  # node 3 (a leaf with room) sits under the pruned node 2
    assert not t[2].pruned and mcts.select() == 3
    child(t, 5, 3, 1.0)
    child(t, 6, 3, 1.0)
    assert not t[2].pruned and not t[3].pruned  # not pruned again while the pin holds
    t[2].pruned = True  # a path pruned before the pin (a run resumed as it was left) is walked all the same
    assert mcts.select() in {3, 5, 6}
    assert t.pin(3, False) == []


def test_a_pin_that_cannot_act_says_why() -> None:
    t = tree()
    child(t, 2, 1, None, failure="compile")
    child(t, 3, 1, 2.0)
    child(t, 4, 3, 2.0)
    assert t.pin_problem(2) == "node 2 failed (compile): nothing is proposed under a failed kernel"
    t.ban(3)
    assert t.pin_problem(3) == "node 3 is banned: unban it first"
    assert t.pin_problem(4) == "node 4 is in the banned subtree of node 3: unban node 3 first"
    t.ban(3, False)
    assert t.pin_problem(4) is None


def test_hints_nearest_first_and_children_params() -> None:
    t = tree()
    child(t, 2, 1, 2.0)
    t.root.hints.append("use warp shuffles")
    t[2].hints.append("vector width 8")
    assert t.hints_for(2) == ["vector width 8", "use warp shuffles"]
    assert t.children_params(1) == [{"id": 2}]


def test_best_node() -> None:
    t = tree()
    child(t, 2, 1, 2.0)
    child(t, 3, 2, 2.5)
    child(t, 4, 1, None, failure="cheat")
    best = t.best_node()
    assert best is not None and best.id == 3


def test_a_given_score_replaces_log_speedup_and_rescore_moves_it() -> None:
    t = tree()
    t.add(2, 1)
    t.finish(2, NodeStatus.TIMED, 2.0, score=0.75)  # e.g. ln 2 = 0.693 plus hardware evidence 0.057
    child(t, 3, 2, 1.5)  # no score: ln 1.5 = 0.405465
    assert t.reward(t[2]) == 0.75
    assert t[2].value == pytest.approx(0.75 + math.log(1.5))  # 1.155465
    assert t.root.value == pytest.approx(0.0 + 0.75 + math.log(1.5)) and t.root.best == 0.75
    t.rescore(2, 0.25)  # a profile arrived: the guardrails cost 0.5
    assert t[2].value == pytest.approx(0.25 + math.log(1.5))  # 0.655465
    assert t.root.value == pytest.approx(0.655465, abs=1e-6) and t.root.visits == 3
    assert t[2].best == pytest.approx(math.log(1.5)) and t.root.best == pytest.approx(0.405465, abs=1e-6)


def test_strategies_are_found_by_name() -> None:
    t = tree()
    strategy = make_strategy("mcts", t)
    assert isinstance(strategy, Mcts) and isinstance(strategy, Strategy) and set(STRATEGIES) == {"mcts"}
    with pytest.raises(UnknownStrategy, match="no selection strategy 'beam': use one of mcts"):
        make_strategy("beam", t)


def test_stats_are_what_the_store_keeps() -> None:
    t = tree()
    child(t, 2, 1, 2.0)
    stats = t.stats([1, 2])
    assert stats[1].visits == 2 and stats[1].value == pytest.approx(LN2 / 2)
    assert stats[2].visits == 1 and stats[2].value == pytest.approx(LN2)
