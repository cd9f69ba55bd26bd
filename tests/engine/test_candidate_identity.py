"""A candidate's identity (vocabulary/identity.py): template candidates are (template, version, canonical typed params)
on a card, whatever their text; the others are their normalised source and plan. The search drops a candidate whose
identity the run holds, a resume gives nodes stored without one theirs, and a template's changed render needs a new
version (the golden render test's rule)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kernelforge_tui.cards.directory import load_card
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.engine.backend import SimulatedBackend
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.pipeline import Priority
from kernelforge_tui.engine.search import Search
from kernelforge_tui.proposers.base import Proposal
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates.row_reductions import RowParams
from kernelforge_tui.store import RunStore
from kernelforge_tui.store.listing import copy_run
from kernelforge_tui.vocabulary.identity import (
    SourceIdentity,
    TemplateIdentity,
    candidate_key,
    canonical_json,
    source_identity,
)
from tests.conftest import EXAMPLES
from tests.engine.test_search import make_card, run_settings
from tests.proposers.templates.test_levers import NoCompiler
from tests.proposers.templates.test_templates import _softmax_card
from tests.support import golden_digests

PLAN = LaunchPlan(entry="k", grid=["1"], block=[32], args=[])
SEED = {"strategy": "block_per_row", "block": 1024, "rpb": 1, "vec": 8, "storage": "smem", "minb": 1,
        "online": 0, "fast_exp": 1}  # fmt: skip


def _softmax_identity(params: dict[str, object]) -> TemplateIdentity:
    card = _softmax_card()
    template = template_for(card)
    assert template is not None
    typed = template.valid(card, params)
    assert typed is not None, params
    return template.identity(typed)


def test_equal_params_are_one_candidate_whatever_their_order_or_spelling() -> None:
    card = _softmax_card()
    reordered = dict(reversed(list(SEED.items())))
    assert _softmax_identity(SEED) == _softmax_identity(reordered)
    assert candidate_key(_softmax_identity(SEED), card) == candidate_key(_softmax_identity(reordered), card)
    # rows_per_block with one row a block is block_per_row: the canonical params, so the identity, are the same
    assert _softmax_identity({**SEED, "strategy": "rows_per_block"}) == _softmax_identity(SEED)
    version = _softmax_identity(SEED).version
    shuffled = TemplateIdentity(template="rows", version=version, params=dict(reversed(list(SEED.items()))))
    assert canonical_json(shuffled) == canonical_json(_softmax_identity(SEED))


def test_other_params_templates_versions_or_cards_are_other_candidates() -> None:
    card = _softmax_card()
    seed = _softmax_identity(SEED)
    keys = {
        candidate_key(seed, card),
        candidate_key(_softmax_identity({**SEED, "block": 512}), card),
        candidate_key(seed.model_copy(update={"version": seed.version + 1}), card),
        candidate_key(seed.model_copy(update={"template": "elementwise"}), card),
        candidate_key(seed, card.model_copy(update={"sizes": {**card.sizes, "rows": 2 * card.sizes["rows"]}})),
    }
    assert len(keys) == 5


def test_a_source_identity_reads_through_line_ends_and_trailing_blanks_but_not_code_or_plan() -> None:
    source = 'extern "C" __global__ void k() {\n    int i = 0;\n}\n'
    same = source.replace("\n", "\r\n").replace("int i = 0;", "int i = 0;   ") + "\n\n"
    assert source_identity(same, PLAN) == source_identity(source, PLAN)
    assert source_identity(source.replace("0", "1"), PLAN) != source_identity(source, PLAN)
    assert source_identity(source, PLAN.model_copy(update={"block": [64]})) != source_identity(source, PLAN)


def test_typed_params_refuse_values_of_another_type_or_a_name_the_model_lacks() -> None:
    card = _softmax_card()
    template = template_for(card)
    assert template is not None
    assert template.valid(card, SEED) == RowParams.model_validate(SEED)
    assert template.valid(card, {**SEED, "online": False}) is None, "False equals 0, but is not an int"
    assert template.valid(card, {**SEED, "block": "1024"}) is None
    assert template.valid(card, {**SEED, "welford": 0}) is None, "softmax has no welford"
    with pytest.raises(ValueError, match="extra"):
        RowParams.model_validate({**SEED, "tile": 4})
    with pytest.raises(ValueError, match="frozen"):
        RowParams.model_validate(SEED).block = 512  # type: ignore[misc]


def _search(tmp_path: Path) -> Search:
    card = make_card(tmp_path / "card")
    assert template_for(card.spec) is not None, "the toy card is an elementwise template card"
    backend = SimulatedBackend(card, NoCompiler(), eval_seconds=0.001)
    store = RunStore.create(tmp_path / "run", card, backend.name, backend.gpu_name, run_settings(Budget()))
    search = Search(card, TemplateProposer(), backend, store, run_settings(Budget()))
    baseline = card.spec.baseline
    assert baseline is not None
    root = Proposal(source=card.baseline_source(), plan=baseline.plan, mutation="baseline", proposer="card")
    assert search.pipeline.submit(None, root, Priority.STEERED) is not None
    return search


def test_a_changed_render_of_the_same_params_is_the_same_candidate_until_its_version_is_bumped(
    tmp_path: Path,
) -> None:
    """A render that changed silently (no new version) is the candidate the run holds: dropped, not evaluated as
    new; the same render under a new template version is a new candidate."""
    search = _search(tmp_path)
    seed = TemplateProposer().seeds(search.card)[0]
    root = search.tree.root_id
    assert seed.identity is not None and search.pipeline.submit(root, seed, Priority.NORMAL) is not None
    rerendered = seed.model_copy(update={"source": seed.source.replace("Generated by", "Written by")})
    assert rerendered.source != seed.source
    assert search.pipeline.submit(root, rerendered, Priority.NORMAL) is None
    next_version = seed.identity.model_copy(update={"version": seed.identity.version + 1})
    bumped = rerendered.model_copy(update={"identity": next_version})
    assert search.pipeline.submit(root, bumped, Priority.NORMAL) is not None
    # a kernel nothing parameterises is its source: the same text is dropped, whatever proposer sent it
    hand = Proposal(source=seed.source, plan=seed.plan, mutation="by hand", proposer="hand")
    assert search.pipeline.submit(root, hand, Priority.NORMAL) is not None, "a template's text is not its identity"
    assert search.pipeline.submit(root, hand.model_copy(update={"proposer": "agent"}), Priority.NORMAL) is None
    stored = {r.id: r.identity for r in search.store.node_records()}
    assert [type(i) for i in stored.values()] == [SourceIdentity, TemplateIdentity, TemplateIdentity, SourceIdentity]
    search.store.close()


def test_a_resume_gives_nodes_stored_without_an_identity_theirs_and_keeps_them(tmp_path: Path) -> None:
    """A node stored before identities (its column NULL) is its template's candidate when today's render of its
    params is its source, else its source's; the resumed run then holds every identity."""
    search = _search(tmp_path)
    seeds = TemplateProposer().seeds(search.card)
    root = search.tree.root_id
    for seed in seeds[:2]:
        assert search.pipeline.submit(root, seed, Priority.NORMAL) is not None
    search.store.close()
    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as conn:
        conn.execute("UPDATE nodes SET identity = NULL")
        conn.execute("UPDATE nodes SET source = source || '// an older render' WHERE id = 3")
    with RunStore.resume(tmp_path / "run") as store:
        resumed = Search(search.card, TemplateProposer(), search.backend, store, run_settings(Budget()))
        kinds = {r.id: r.identity.kind if r.identity else None for r in store.node_records()}
        assert kinds == {1: "source", 2: "template", 3: "source"}
        assert resumed.pipeline.submit(root, seeds[0], Priority.NORMAL) is None, "node 2's params"
        assert resumed.pipeline.submit(root, seeds[1], Priority.NORMAL) is not None, "node 3 was another kernel"


def test_a_recorded_example_run_resumes_with_identities_for_every_node(tmp_path: Path) -> None:
    run = copy_run(EXAMPLES / "runs" / "rms_norm_bf16", tmp_path / "run")
    with RunStore.resume(run) as store:
        card = load_card(store.card_dir())
        backend = SimulatedBackend(card, NoCompiler(), eval_seconds=0.001)
        search = Search(card, TemplateProposer(), backend, store, run_settings(Budget()))
        records = store.node_records()
        assert records and all(r.identity is not None for r in records)
        assert len(search.pipeline.tried_candidates()) == len({candidate_key(r.identity, card.spec) for r in records})
        for rec in records[:5]:  # every stored kernel is a candidate the resumed run holds
            again = Proposal(source=rec.source, plan=rec.plan, mutation="again", proposer="hand")
            assert search.pipeline.submit(rec.parent_id, again, Priority.NORMAL) is None


def test_a_changed_render_under_its_old_version_fails_the_golden_test_even_when_updating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(golden_digests, "GOLDEN", tmp_path)
    (tmp_path / "renders.json").write_text(json.dumps({"T": {"version": 1, "renders": {"seed": "aaa"}}}))
    monkeypatch.setattr(golden_digests, "UPDATE", True)
    with pytest.raises(AssertionError, match="bump its version"):
        golden_digests.assert_matches_golden("renders.json", "T", {"seed": "bbb"}, version=1)
    golden_digests.assert_matches_golden("renders.json", "T", {"seed": "bbb"}, version=2)
    assert json.loads((tmp_path / "renders.json").read_text()) == {"T": {"version": 2, "renders": {"seed": "bbb"}}}
    monkeypatch.setattr(golden_digests, "UPDATE", False)
    with pytest.raises(AssertionError, match="holds version 2"):
        golden_digests.assert_matches_golden("renders.json", "T", {"seed": "bbb"}, version=3)
