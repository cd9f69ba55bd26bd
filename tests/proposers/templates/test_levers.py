"""The parent's profile picks the template moves tried first, and a spent template space is said as the run's reason.

A memory-bandwidth-bound parent gets moves along its template's bandwidth levers (wider accesses, fewer passes)
ahead of the others, a latency-bound one moves along latency levers (occupancy, parallelism, loads in flight), a
compute-bound one fast math where the card's tolerance allows it and never where it does not; without a profile
the order is the plain one. A search that tries every valid configuration of a small space ends saying so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards import Card, OperatorCard
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.engine.backend import SimulatedBackend
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.search import Search
from kernelforge_tui.engine.settings import RunSettings
from kernelforge_tui.proposers.base import Proposal, SpaceCounter
from kernelforge_tui.proposers.templates import TemplateProposer, template_for
from kernelforge_tui.proposers.templates import proposer as proposer_module
from kernelforge_tui.proposers.templates.common import Params, Template, TemplateParams, describe
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.evaluation import BuildResult
from kernelforge_tui.vocabulary.identity import candidate_key
from kernelforge_tui.vocabulary.nodes import ParamValue
from kernelforge_tui.vocabulary.profiles import CLASS_NAMES, Bottleneck, HardwareReport, NodeProfile, ProfileReport
from tests.engine.test_search import run_settings
from tests.proposers.templates.test_templates import _card, _context, synthetic_cards

RC = ["rows", "cols"]
NCHW = ["n", "c", "h", "w"]
ALL = 100_000
"""More children than any space has: the whole order."""


def profile(bottleneck: Bottleneck) -> NodeProfile:
    """A parent's profile of the class (the proposer reads only the class)."""
    hardware = HardwareReport(
        kernel="kf", bottleneck=bottleneck, sm_pct=50, memory_pct=50, threshold_pct=30, reason="", key_metrics=[]
    )
    return NodeProfile(profile=ProfileReport(kernel="kf", metrics={}), hardware=hardware)


def softmax(dtype: str = "bfloat16", rtol: float | None = None) -> OperatorCard:
    card = _card(f"softmax_{dtype}", "softmax", {"rows": 512, "cols": 4096}, [("x", dtype, RC)], [("y", dtype, RC)])
    if rtol is None:
        return card
    data = card.model_dump()
    data["outputs"][0]["tolerance"] = {"rtol": rtol, "atol": 1e-6}
    return OperatorCard.model_validate(data)


def cards() -> dict[str, tuple[OperatorCard, int]]:
    """One card of each family the ranking is checked on, with the seed to mutate: one with levers of both memory
    classes left to pull (the first seeds often start at the widest vector and the fewest passes already)."""
    by_name = {c.name: c for c in synthetic_cards()}
    rms = _card("rms_norm_bf16", "rms_norm", {"rows": 4096, "cols": 4096},
                [("x", "bfloat16", RC), ("w", "bfloat16", ["cols"])], [("y", "bfloat16", RC)])  # fmt: skip
    return {
        "softmax": (softmax(), 4),  # block_per_row 512, stream
        "rms_norm": (rms, 5),  # warp_per_row 128, stream, vec 1
        "elementwise": (by_name["vector_add_bf16"], 0),  # grid_stride, unroll 1
        "group_norm": (by_name["group_norm_bf16"], 10),  # reread, block 1024, split 2, centred moments
        "stencil": (by_name["stencil2d"], 0),  # strip 32 x 8, 8 rows a thread, vec 4, minb 4
    }


def template(card: OperatorCard) -> Template:
    found = template_for(card)
    assert found is not None, card.name
    return found


def along(card: OperatorCard, bottleneck: Bottleneck, parent: Params, child: Params) -> bool:
    """Whether the move goes along the template's levers for the class: it moves some, each its way."""
    t = template(card)
    space = t.space(card)
    moved = [lever for lever in t.levers_of(card, bottleneck) if child[lever.param] != parent[lever.param]]
    return bool(moved) and all(lever.pulled(space[lever.param], parent[lever.param], child[lever.param])
                               for lever in moved)  # fmt: skip


async def order(card: OperatorCard, parent: Params, bottleneck: Bottleneck | None, n: int = ALL) -> list[Proposal]:
    ctx = _context(card, parent)
    ctx.parent.profile = profile(bottleneck) if bottleneck is not None else None
    return await TemplateProposer().propose(ctx, n)


def seed(card: OperatorCard, index: int = 0) -> Params:
    return TemplateProposer().seeds(card)[index].params


def partitioned(flags: Sequence[bool]) -> bool:
    """Every True before every False."""
    return list(flags) == sorted(flags, reverse=True)


@pytest.mark.parametrize("family", ["softmax", "rms_norm", "elementwise", "group_norm", "stencil"])
@pytest.mark.parametrize("bottleneck", ["memory_bandwidth", "memory_latency"])
async def test_a_profiled_parent_gets_its_class_levers_first(family: str, bottleneck: Bottleneck) -> None:
    card, index = cards()[family]
    parent = seed(card, index)
    plain = await order(card, parent, None)
    ranked = await order(card, parent, bottleneck)
    plain_flags = [along(card, bottleneck, parent, p.params) for p in plain]
    ranked_flags = [along(card, bottleneck, parent, p.params) for p in ranked]
    assert not partitioned(plain_flags)  # the plain order mixes lever moves with others
    assert ranked_flags[0] and partitioned(ranked_flags), [p.mutation for p in ranked[:12]]
    assert sorted(repr(p.params) for p in ranked) == sorted(repr(p.params) for p in plain)  # reordered, not changed
    why = f"({CLASS_NAMES[bottleneck]} parent: "
    assert all((why in p.mutation) == lever and "\n" not in p.mutation
               for p, lever in zip(ranked, ranked_flags, strict=True))  # fmt: skip
    assert not any(" parent: " in p.mutation for p in plain)


async def test_each_lever_takes_its_nearest_step_before_any_takes_a_second() -> None:
    """A latency-bound softmax parent: minb, block and rpb each move a step, in the levers' order, before any pair or
    second step (block 256 -> 128 and rpb 4 -> 8 make 32 threads a row: warp_per_row, a change of two)."""
    card = softmax()
    parent = seed(card, 3)  # rows_per_block: block 256, 4 rows per block, minb 1
    ranked = await order(card, parent, "memory_latency", n=3)
    assert [p.mutation for p in ranked] == [
        "minb 1 -> 2 (memory-latency-bound parent: more resident blocks)",
        "block 256 -> 512 (memory-latency-bound parent: threads per row)",
        "rpb 4 -> 2 (memory-latency-bound parent: rows per block)",
    ]


async def test_a_bandwidth_bound_row_kernel_stops_rereading_its_row_first() -> None:
    """The row read once (shared memory is one step from streaming, registers two), then wider accesses."""
    card, _ = cards()["rms_norm"]
    parent = {**seed(card, 1), "storage": "stream", "vec": 4}  # block_per_row 512
    assert valid_dict(card, parent) == parent
    ranked = await order(card, parent, "memory_bandwidth", n=3)
    assert [p.mutation for p in ranked] == [
        "storage stream -> smem (memory-bandwidth-bound parent: the row read once)",
        "vec 4 -> 8 (memory-bandwidth-bound parent: wider accesses)",
        "storage stream -> registers (memory-bandwidth-bound parent: the row read once)",
    ]


async def test_a_compute_bound_parent_gets_fast_math_first_where_the_tolerance_allows() -> None:
    card = softmax()  # bf16: rtol 1.6e-2
    parent = {**seed(card), "fast_exp": 0}
    assert valid_dict(card, parent) == parent
    plain = await order(card, parent, None)
    assert plain[0].params["fast_exp"] == 0  # the plain order starts elsewhere
    ranked = await order(card, parent, "compute")
    assert ranked[0].params == {**parent, "fast_exp": 1}
    assert ranked[0].mutation == "fast_exp 0 -> 1 (compute-bound parent: fast exp)"


@pytest.mark.parametrize("bottleneck", ["compute", None])
async def test_a_tight_tolerance_never_gets_fast_math(bottleneck: Bottleneck | None) -> None:
    card = softmax("float32", rtol=1e-6)
    t = template(card)
    assert t.space(card)["fast_exp"] == (0, 1)
    assert all(s.params["fast_exp"] == 0 for s in TemplateProposer().seeds(card))
    parent = seed(card)
    children = await order(card, parent, bottleneck)
    assert len(children) > 20 and all(c.params["fast_exp"] == 0 for c in children)
    assert t.valid(card, {**parent, "fast_exp": 1}) is None
    loose = softmax("float32")  # fp32's default rtol 1e-5: __expf passes the stress sets there
    assert template(loose).valid(loose, {**parent, "fast_exp": 1}) is not None


@pytest.mark.parametrize("family", ["softmax", "elementwise", "group_norm", "stencil"])
async def test_without_levers_a_profile_changes_nothing(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain order is the order a profiled parent gets from a template that declares no levers."""
    card, index = cards()[family]
    parent = seed(card, index)
    plain = [p.mutation for p in await order(card, parent, None)]
    monkeypatch.setattr(type(template(card)), "levers", {})
    assert [p.mutation for p in await order(card, parent, "memory_bandwidth")] == plain


async def test_the_number_of_waves_is_offered_though_only_the_grid_changes() -> None:
    """A grid-stride kernel's waves moves are not taken for the parent, though only their plans' grids differ."""
    card, _ = cards()["elementwise"]
    parent = seed(card)
    assert parent["loop"] == "grid_stride"
    template = template_for(card)
    assert template is not None
    tried = candidate_key(template.identity(template.valid(card, parent)), card)
    ctx = _context(card, parent, tried_candidates={tried})
    children = await TemplateProposer().propose(ctx, ALL)
    waves = [c for c in children if c.params["waves"] != parent["waves"] and c.params["loop"] == "grid_stride"]
    assert waves and all(f"over {c.params['waves']} waves" in c.source for c in waves)


def valid_dict(card: OperatorCard, params: Params) -> Params | None:
    """The card's template's canonical form of the params, as a dict."""
    canon = template(card).valid(card, params)
    return None if canon is None else canon.as_dict()


def avg_pool_card() -> OperatorCard:
    """Average pooling of 7x7 fp32 planes (served by GridTemplate in these tests)."""
    return _card("avg_pool_f32", "pooling", {"n": 4, "c": 8, "h": 7, "w": 7}, [("x", "float32", NCHW)],
                 [("y", "float32", ["n", "c"])])  # fmt: skip


class GridParams(TemplateParams):
    tpr: int
    block: int
    vec: int


class GridTemplate(Template[GridParams]):
    """A pooling template with a known space, so the counts below do not move when the real pooling template grows:
    6 tpr x 4 blocks x 3 vecs, valid with vec 1 only (the others do not divide 49): 24 of 72 configurations; six
    seeds, more than the 4 valid among the first 12 combinations (the capped count below)."""

    name = "grid"
    families = ("pooling",)

    def unsupported(self, card: OperatorCard) -> str | None:
        return None

    def params_type(self, card: OperatorCard) -> type[GridParams]:
        return GridParams

    def space(self, card: OperatorCard) -> dict[str, tuple[ParamValue, ...]]:
        return {"tpr": (1, 2, 4, 8, 16, 32), "block": (64, 128, 256, 512), "vec": (1, 2, 4)}

    def problem(self, card: OperatorCard, params: GridParams) -> str | None:
        return None if params.vec == 1 else "vec must divide the plane's 49 elements"

    def render(self, card: OperatorCard, params: GridParams) -> tuple[str, LaunchPlan]:
        source = f'extern "C" __global__ void pool() {{}}  // {describe(params.as_dict())}\n'
        return source, LaunchPlan(entry="pool", grid=["1"], block=[params.block], args=[])

    def seed_params(self, card: OperatorCard) -> list[Params]:
        return [
            {"tpr": t, "block": b, "vec": 1} for t, b in ((1, 128), (2, 256), (4, 64), (8, 512), (16, 128), (32, 256))
        ]


@pytest.fixture
def grid_template(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proposer_module, "TEMPLATES", (GridTemplate(),))


def with_baseline(spec: OperatorCard, root: Path) -> Card:
    """The card in a directory with a baseline kernel (never compiled here: see NoCompiler)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "baseline.cu").write_text('extern "C" __global__ void pool(const float* x, float* y, int p, int hw) {}\n')
    plan = {"entry": "pool", "grid": ["cdiv(n * c, 128)"], "block": [128], "args": ["x", "y", "n * c", "h * w"]}
    data = spec.model_dump(mode="json") | {"baseline": {"source": "baseline.cu", "plan": plan}}
    return Card(spec=OperatorCard.model_validate(data), root=root)


class NoCompiler(Builder):
    """Every source builds at once: the search's course, not nvcc, is under test (the templates' sources are
    compiled in test_templates)."""

    async def build(self, source: str, entry: str, args: Sequence[object] | None = None) -> BuildResult:
        key = hashlib.sha256(source.encode()).hexdigest()
        return BuildResult(ok=True, cubin_path=Path(f"{key}.cubin"), key=key)


@pytest.mark.usefixtures("grid_template")
async def test_a_search_that_spends_the_template_space_says_so(tmp_path: Path) -> None:
    card = with_baseline(avg_pool_card(), tmp_path / "card")
    backend = SimulatedBackend(card, NoCompiler(), eval_seconds=0.001)
    store = RunStore.create(tmp_path / "run", card, backend.name, backend.gpu_name, RunSettings())
    settings = run_settings(Budget(max_iterations=500), prune_after=1000)  # nothing pruned: every branch is walked
    info = await Search(card, TemplateProposer(), backend, store, settings).run()
    tried = {repr(sorted(n.params.items())) for n in store.node_records() if n.params}
    store.close()
    assert len(tried) == 24 and info.node_count == 25  # the baseline and each configuration once
    assert info.reason == "the templates' space for this card is exhausted: 24 configurations tried of 24 valid"


@pytest.mark.usefixtures("grid_template")
def test_coverage_of_a_partly_tried_space_and_of_one_too_large_to_count(monkeypatch: pytest.MonkeyPatch) -> None:
    proposer = TemplateProposer()
    assert isinstance(proposer, SpaceCounter)
    card = avg_pool_card()
    seeds = [s.params for s in proposer.seeds(card)]
    coverage = proposer.coverage(card, [*seeds, seeds[0], {}, {"tpr": 3}])  # a twin, an LLM's node, foreign params
    assert coverage is not None and (coverage.tried, coverage.valid, coverage.counted_all) == (len(seeds), 24, True)
    assert coverage.reason("nothing left") == (
        f"nothing left (the templates' space for this card: {len(seeds)} configurations tried of 24 valid)"
    )
    monkeypatch.setattr(proposer_module, "COUNT_CAP", 12)  # tpr 1's 4 blocks x 3 vecs of the 96: 4 valid (vec 1)
    capped = proposer.coverage(card, seeds[:1])
    assert capped is not None and (capped.tried, capped.valid, capped.counted_all) == (1, 4, False)
    assert capped.reason("nothing left").endswith("(the templates' space for this card: 1 configurations tried of at "
                                                  "least 4 valid)")  # fmt: skip
    spent = proposer.coverage(card, seeds)  # more tried than counted: the count is raised to them, still a bound
    assert spent is not None and (spent.valid, spent.counted_all) == (len(seeds), False)
    assert spent.reason("nothing left").startswith("nothing left (")
    foreign = _card("sort", "sort", {"n": 8}, [("x", "float32", ["n"])], [("y", "float32", ["n"])])
    assert proposer.coverage(foreign, []) is None
