"""Steering without traps: a pin reopens the path to its node (or is refused with the reason), a run at rest can be
unpinned and resumed, hints say what the proposer understood, and a card no template serves says so."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from kernelforge_tui.cards import load_card
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.config import load_settings
from kernelforge_tui.engine.at_rest import NeedsLiveSearch, steer_at_rest
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.feedback import cannot_serve, hint_feedback
from kernelforge_tui.engine.search import Search
from kernelforge_tui.engine.setup import RunOptions, prepare_run
from kernelforge_tui.errors import BadInput
from kernelforge_tui.proposers.agents import AgentProposer
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.store import RunStore, StoreError
from kernelforge_tui.tui.launch import RestingRunSource, continued_search, open_run, open_source
from kernelforge_tui.vocabulary.commands import AddHint, ExpandNode, PinSubtree
from kernelforge_tui.vocabulary.events import EngineEvent, LogLine, NodeChanged
from tests.engine.test_search import Harness, ToyProposer, _toml
from tests.support.fakes.endless import Endless

TOY = "tests.engine.test_search:ToyProposer"


def stale(h: Harness, budget: Budget) -> Search:
    """A search under which a node is pruned as soon as its subtree grows: nothing counts as an improvement."""
    return h.search(budget, prune_after=1.0, improvement_epsilon=5.0)


def logs(events: list[EngineEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, LogLine)]


def drain(queue: asyncio.Queue[EngineEvent]) -> list[EngineEvent]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


async def seeded(h: Harness) -> Harness:
    """The root and the two seeds, measured: a run at rest to steer."""
    await h.search(Budget(max_iterations=2)).run()
    h.store.close()
    return h


async def pruned_run(tmp_path: Path) -> tuple[Harness, int, int]:
    """A run at rest in which seed 2 was expanded and then pruned (stalled): (harness, 2, a measured child of 2)."""
    h = await seeded(Harness(tmp_path, Endless()))
    search = stale(h, Budget(max_iterations=6))
    await search.send(ExpandNode(node_id=2))
    await search.run()
    h.store.close()
    resumed = stale(h, Budget(max_iterations=6))
    assert resumed.tree[2].pruned
    child = next(c for c in resumed.tree[2].children if resumed.tree[c].measured)
    h.store.close()
    return h, 2, child


async def test_a_pin_under_a_pruned_node_reopens_the_path_and_expands_the_pinned_node(tmp_path: Path) -> None:
    h, pruned, child = await pruned_run(tmp_path)
    search = stale(h, Budget(max_iterations=9))
    events = search.subscribe()
    before = len(h.store.nodes())
    await search.send(PinSubtree(node_id=child))
    info = await search.run()
    assert "nothing left to expand" not in info.reason and "iteration budget" in info.reason, info.reason
    new = [n for n in h.store.nodes() if n.id > before]
    assert new and new[0].parent_id == child  # the pinned node's children, not a search ended at once
    assert f"pinned node {child}: the search stays inside its subtree; the pruned nodes on the way there are open " \
           f"again (#{pruned})" in logs(drain(events))  # fmt: skip
    h.store.close()


async def test_a_pin_that_cannot_act_is_refused_with_the_reason(tmp_path: Path) -> None:
    h = await seeded(Harness(tmp_path, ToyProposer(fail_vec=2)))  # seed 3 is (64, 2): it fails
    search = h.search(Budget(max_iterations=4))
    events = search.subscribe()
    await search.send(PinSubtree(node_id=3))
    search.tree.ban(1)
    await search.send(PinSubtree(node_id=2))
    said = logs(drain(events))
    assert "pin of node 3 refused: node 3 failed (mismatch): nothing is proposed under a failed kernel" in said
    assert "pin of node 2 refused: node 2 is in the banned subtree of node 1: unban node 1 first" in said
    assert not h.store.node(3).pinned and not h.store.node(2).pinned
    h.store.close()


async def test_pins_with_nothing_left_inside_are_released_and_the_search_goes_on(tmp_path: Path) -> None:
    h = await seeded(Harness(tmp_path))
    search = h.search(Budget(max_iterations=5))
    events = search.subscribe()
    await search.send(PinSubtree(node_id=2))
    search.tree[2].exhausted = True  # the proposer has nothing more for node 2, the pin's whole subtree
    info = await search.run()
    assert "iteration budget" in info.reason
    assert "nothing left to expand inside the pinned subtrees (#2): unpinned, the search goes on over the whole " \
           "tree" in logs(drain(events))  # fmt: skip
    assert not h.store.node(2).pinned
    h.store.close()


async def test_a_run_at_rest_is_unpinned_from_open_and_a_resume_continues(tmp_path: Path) -> None:
    h, _, child = await pruned_run(tmp_path)
    with RunStore.open(h.run_dir) as store:  # pinned while at rest: the state an old run ended in
        store.set_pinned(child, True)
    events = steer_at_rest(h.run_dir, PinSubtree(node_id=child, pinned=False))
    assert isinstance(events[0], NodeChanged) and not events[0].node.pinned
    assert f"unpinned node {child} (applied when the run resumes)" in logs(events)
    with RunStore.open(h.run_dir, readonly=True) as viewer:  # recorded for every viewer, and as applied
        assert not viewer.node(child).pinned
        assert viewer.pending_commands() == []
        assert any(isinstance(e, NodeChanged) and e.node.id == child for _, e in viewer.events_since(0, 10_000))
    with pytest.raises(NeedsLiveSearch, match=r"continue the run with `kernelforge open .* --resume`"):
        steer_at_rest(h.run_dir, AddHint(node_id=child, text="block=256"))
    steer_at_rest(h.run_dir, PinSubtree(node_id=child))  # and pinned again, to resume into
    search = stale(h, Budget(max_iterations=9))
    before = len(h.store.nodes())
    with pytest.raises(StoreError, match="being written by"):  # a live run is steered through its commands
        steer_at_rest(h.run_dir, PinSubtree(node_id=child, pinned=False))
    info = await search.run()
    assert "iteration budget" in info.reason
    assert next(n.parent_id for n in h.store.nodes() if n.id > before) == child
    h.store.close()


async def test_a_hint_is_answered_with_what_the_templates_understood(tmp_path: Path) -> None:
    h = await seeded(Harness(tmp_path))
    search = h.search(Budget())
    search.proposer = TemplateProposer()  # the toy card is an elementwise add: the elementwise template serves it
    events = search.subscribe()
    for text in ("block 256, please", "make it faster", "block=333"):
        await search.send(AddHint(node_id=1, text=text))
    said = logs(drain(events))
    assert any("('block 256, please'): read block=256: tried first" in line for line in said), said
    assert any("('make it faster'): understood nothing in it" in line and "block (128, 256, 512, 1024)" in line
               for line in said), said  # fmt: skip
    assert any("block=333 is not a value block takes (128, 256, 512, 1024)" in line for line in said), said
    h.store.close()


def test_the_agents_keep_a_hint_as_written_and_a_composite_answers_with_each_part(tmp_path: Path) -> None:
    card = Harness(tmp_path).card.spec

    class Agents(ToyProposer):
        """The agent team's answer to a hint, without a team to build."""

        name = "agents"

        def read_hint(self, card: OperatorCard, text: str) -> str:
            return AgentProposer.read_hint(cast(AgentProposer, self), card, text)

    class Hybrid(ToyProposer):
        name = "hybrid"

        def __init__(self) -> None:
            super().__init__()
            self.templates = TemplateProposer()
            self.agents = Agents()

    said = hint_feedback(Agents(), card, "use shared memory")
    assert said == "kept as written: it goes into the planner's prompt (and a first kernel's) for this node and its " \
                   "subtree"  # fmt: skip
    both = hint_feedback(Hybrid(), card, "vec=4")
    assert both.startswith("templates: read vec=4: tried first") and "; agents: kept as written" in both
    assert hint_feedback(ToyProposer(), card, "x") == (
        "handed to the toy proposer as written (it says nothing about what it understood)"
    )


async def test_a_card_no_template_serves_says_why_instead_of_succeeding_silently(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    spec = h.card.spec.model_copy(update={"family": "other"})
    (h.card.root / "card.toml").write_text(_toml(spec))
    h.card = load_card(h.card.root)
    assert cannot_serve(TemplateProposer(), h.card.spec) is not None
    search = h.search(Budget(max_iterations=6))
    search.proposer = TemplateProposer()
    events = search.subscribe()
    info = await search.run()
    why = "has no template for family other"
    assert info.reason.startswith("nothing to propose: the templates proposer " + why), info.reason
    assert "use --proposer agents" in info.reason
    assert any(why in line for line in logs(drain(events)))
    h.store.close()


async def test_open_says_how_to_continue_a_run_that_is_over_and_steers_its_flags_at_rest(tmp_path: Path) -> None:
    h = await seeded(Harness(tmp_path))  # simulated, finished on its iteration budget
    source = open_source(str(h.run_dir))
    assert isinstance(source, RestingRunSource) and source.can_steer
    assert source.note is not None and f"`kernelforge open {h.run_dir} --resume`" in source.note
    assert source.note in [line.text for line in source.snapshot().logs]  # heads the view's log
    await source.send(PinSubtree(node_id=2))
    await source.send(ExpandNode(node_id=2))
    events = await source.poll_events()
    assert any(isinstance(e, NodeChanged) and e.node.id == 2 and e.node.pinned for e in events)
    assert any("expand acts only on a running search: continue the run with" in line for line in logs(events))
    await source.close()
    with pytest.raises(BadInput, match="budgets, --simulate and --cluster are for continuing the run: add --resume"):
        open_run(str(h.run_dir), budget=Budget(max_iterations=5))


async def test_open_resume_continues_a_simulated_run_in_place(tmp_path: Path) -> None:
    card = Harness(tmp_path).card
    run_dir = tmp_path / "optimized"
    options = RunOptions(run_dir=run_dir, budget=Budget(max_iterations=2), proposer=TOY, simulate=True)
    first = prepare_run(card.root, load_settings(), options)  # as `optimize --simulate` makes it
    try:
        await first.run()
    finally:
        first.store.close()
    with pytest.raises(BadInput, match=r"spent its budget .* --budget-iters 4"):
        continued_search(str(run_dir), Budget())
    search = continued_search(str(run_dir), Budget(max_iterations=4))  # simulated without being told
    try:
        info = await search.run()
    finally:
        search.store.close()
    assert "iteration budget reached (4 of 4)" in info.reason and info.node_count == 5


def test_tui_takes_simulate_seconds_and_open_takes_resume(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kernelforge_tui.cli import main
    from kernelforge_tui.tui import launch

    seen: dict[str, object] = {}

    def run_tui(card_dir: Path, budget: Budget, **options: object) -> str:
        seen.update(options, budget=budget)
        return str(tmp_path)

    def open_run(run: str, **options: object) -> str:
        seen.update(options, run=run)
        return "how to continue it"

    monkeypatch.setattr(launch, "run_tui", run_tui)
    monkeypatch.setattr(launch, "open_run", open_run)
    assert main.main(["tui", "card", "--simulate", "--simulate-seconds", "2.5"]) == 0
    assert seen["simulate"] is True and seen["simulate_seconds"] == 2.5
    assert main.main(["open", "run-1", "--resume", "--budget-minutes", "10", "--simulate-seconds", "1"]) == 0
    assert seen["run"] == "run-1" and seen["resume"] is True and seen["simulate_seconds"] == 1.0
    assert seen["budget"] == Budget(max_minutes=10)


async def test_the_tui_pins_a_run_at_rest_and_a_followed_runs_stopping_note_ends_with_it(tmp_path: Path) -> None:
    from kernelforge_tui.tui.app import KernelForgeApp
    from kernelforge_tui.tui.config import TuiSettings
    from kernelforge_tui.tui.widgets import SearchTree
    from kernelforge_tui.vocabulary.events import StateChanged

    h = await seeded(Harness(tmp_path))
    source = open_source(str(h.run_dir))
    app = KernelForgeApp(source, TuiSettings(refresh_hz=10))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        assert app.query_one(SearchTree).select_id(2)
        app.selected = 2
        assert app.check_action("pin", ()) and app.check_action("ban", ())  # flags a resume reads back
        assert not app.check_action("expand", ())  # only a running search can expand
        await pilot.press("t")
        await pilot.pause(0.5)
        app.note = "stopping"  # as `S` leaves it on a followed run
        app.apply_events([StateChanged(state="finished", reason="stopped by request")])
        assert app.note == ""
        await pilot.press("q")
    with RunStore.open(h.run_dir, readonly=True) as store:
        assert store.node(2).pinned
