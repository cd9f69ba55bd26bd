"""`kernelforge optimize CAPTURE_DIR`: one search per variant, in order of expected saving, within one budget.

Why one budget split by expected saving: the user has one sum of time (or candidates, GPU seconds, money) to spend
on the model, and a variant that could save 10% of the model deserves ten times what one that could save 1% does.
Each variant's search gets the share of what is left that its expected saving is of the expected savings left, so
what an early search does not use (its proposer ran out of candidates) goes to the later ones. Minutes are wall time,
and a search takes some beyond what its own cap counts (starting and closing its evaluation backend): the later
searches' start-up and shortest search are kept aside before the minutes are shared, and each search's cap leaves
room for its own start-up, so that an early search cannot spend a later one's time (on the H200 the decoder's softmax
search, given 52 of 60 s, took 66 and the next never ran). A capture whose carded variants have nothing to save
(k = 1) is not a failure: the report says nothing is worth searching, and why. On a Dask cluster (`--cluster`) as
many variants are searched at once as it has GPUs, one GPU each, each taking its share when it starts (the minutes
are then lane-minutes: the cluster's GPUs times the wall minutes).

The projection: a searched variant's eager time per call (measured at capture) becomes the best candidate's
measured latency when that is faster (min of the two), times its calls per forward pass; the projected end-to-end
saving is what all searched variants save over the model's total operator time. On a GPU the latency is measured the
worker's way (L2 flushed before every launch), which is pessimistic against a model where inputs may sit in L2.
A simulated search (`--simulate`) invents its timings, so its projection applies the invented speedup over the
card's baseline to the eager time and is labelled simulated everywhere; a capture made on the CPU has CPU times,
which no GPU latency can be set against, so a GPU search of it projects nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.capture.manifest import CaptureManifest, Variant, card_dir, load_capture
from kernelforge_tui.cards import load_card
from kernelforge_tui.config import Settings
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.cluster.backend import Cluster
from kernelforge_tui.engine.setup import DEFAULT_PROPOSER, RunOptions, prepare_run, run_lanes, run_telling_bests
from kernelforge_tui.errors import BadInput, NoGpu
from kernelforge_tui.llm import FatalLlmError
from kernelforge_tui.vocabulary.events import BestImproved
from kernelforge_tui.vocabulary.runs import RunInfo

REPORT = "optimize.json"
"""The report's file in the capture directory (the latest `kernelforge optimize` of it)."""
MIN_MINUTES = 0.05
"""No variant's search gets less than 3 s of a minutes budget (a search must at least build and time its seeds)."""
SEARCH_OVERHEAD_MINUTES = 0.25
"""Wall time a search takes beyond what its own time cap counts (starting and closing the evaluation backend, building
the baseline), until one has been measured: the H200's first capture optimise took 66 s for a search given 52."""
NOTHING_TO_SAVE = "nothing to save (k = 1)"


class CaptureOptimizeOptions(BaseModel):
    """What `kernelforge optimize CAPTURE_DIR` was given."""

    model_config = ConfigDict(extra="forbid")

    budget: Budget = Field(default_factory=Budget)
    """The total for all the variants' searches."""
    top: int | None = Field(default=None, ge=1)
    """Search at most this many variants (the largest expected savings)."""
    variants: list[str] = Field(default_factory=list)
    """Search only these variant ids (in ranked order)."""
    proposer: str | None = None
    strategy: str | None = None
    tree: dict[str, str] = Field(default_factory=dict)
    simulate: bool = False
    simulate_seconds: float = 0.01
    root: Path | None = None
    """Where the runs go (default: CAPTURE_DIR/runs)."""
    max_gpus: int | None = Field(default=None, ge=1)
    cluster: str | None = None
    """A Dask scheduler's address: each variant's search uses every GPU of the cluster (one search at a time, as the
    budget is split between them in order)."""


class VariantResult(BaseModel):
    """One variant's search and what it projects."""

    variant: str
    title: str
    card: str
    expected_saving: float
    budget: Budget
    run_dir: Path | None = None
    state: Literal["pending", "running", "finished", "failed", "not-run"] = "pending"
    reason: str = ""
    candidates: int = 0
    """Candidates the search evaluated (its baseline not counted)."""
    gpu_seconds: float = 0.0
    money_usd: float = 0.0
    """LLM spend of the search (0 with the template proposer)."""
    tokens: int = 0
    best_node: int | None = None
    best_speedup: float | None = None
    """Over the card's baseline."""
    best_latency_us: float | None = None
    eager_us_per_call: float
    calls: int
    wall_seconds: float = 0.0
    """The whole search, start-up and closing included (what the minutes budget is spent on)."""
    projected_us_per_call: float | None = None
    """What the variant would take per call with the best kernel (never more than eager)."""
    saving_us: float = 0.0
    """Per forward pass."""


class Skipped(BaseModel):
    variant: str
    title: str
    reason: str


class CaptureOptimizeReport(BaseModel):
    """`optimize.json`: the searches of one `kernelforge optimize CAPTURE_DIR`, as they go and at the end."""

    format_version: Literal[1] = 1
    capture_dir: Path
    simulated: bool
    comparable: bool
    """Whether the projection means anything: False for a GPU search of a CPU capture, and when nothing was worth
    searching (the note says why)."""
    note: str
    total_time_us: float
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    results: list[VariantResult]
    skipped: list[Skipped]

    @property
    def saving_us(self) -> float:
        return sum(r.saving_us for r in self.results)

    @property
    def projected_saving(self) -> float:
        """The share of the model's eager operator time the best kernels so far would save."""
        return self.saving_us / self.total_time_us if self.total_time_us > 0 else 0.0


Progress = Callable[[CaptureOptimizeReport], None]


def plan_variants(
    manifest: CaptureManifest, root: Path, options: CaptureOptimizeOptions
) -> tuple[list[Variant], list[Skipped]]:
    """The variants to search, best expected saving first, and those left out with the reason."""
    chosen: list[Variant] = []
    skipped: list[Skipped] = []
    wanted = set(options.variants)
    unknown = wanted - {v.id for v in manifest.variants}
    if unknown:
        raise BadInput(f"no variant {sorted(unknown)[0]} in {root} (see kernelforge capture --show {root})")
    templates = (options.proposer or DEFAULT_PROPOSER) == DEFAULT_PROPOSER
    for variant in sorted(manifest.variants, key=lambda v: v.rank):
        if wanted and variant.id not in wanted:
            continue
        if variant.status != "card":
            continue
        if not wanted and variant.expected_saving <= 0:  # whatever the proposer: there is no time to win
            why = f"; {variant.estimate}" if variant.estimate else ""
            skipped.append(Skipped(variant=variant.id, title=variant.title, reason=f"{NOTHING_TO_SAVE}{why}"))
            continue
        if templates and not variant.template:
            skipped.append(Skipped(variant=variant.id, title=variant.title, reason=variant.template_note))
            continue
        if options.top is not None and len(chosen) >= options.top:
            skipped.append(Skipped(variant=variant.id, title=variant.title, reason=f"beyond --top {options.top}"))
            continue
        if not (root / str(variant.card)).is_dir():
            skipped.append(Skipped(variant=variant.id, title=variant.title, reason=f"card {variant.card} is missing"))
            continue
        chosen.append(variant)
    return chosen, skipped


def split_budget(
    total: Budget, used: Budget, weight: float, weights_left: float, reserve_minutes: float = 0.0
) -> Budget | None:
    """This variant's share of what is left of `total` after `used`: weight / weights_left of each cap; None when a
    cap is spent (nothing is left to search with). `reserve_minutes` is kept out of the minutes left before they are
    shared (what the searches after this one will need whatever their share: their start-up and shortest search)."""
    share = weight / weights_left if weights_left > 0 else 1.0
    caps = (
        (total.max_iterations, used.max_iterations),
        (total.max_minutes, used.max_minutes),
        (total.max_gpu_seconds, used.max_gpu_seconds),
        (total.max_money, used.max_money),
        (total.max_tokens, used.max_tokens),
    )
    if any(cap is not None and cap - (spent or 0) <= 0 for cap, spent in caps):
        return None

    def left(cap: float | None, spent: float | None) -> float | None:
        return None if cap is None else max(0.0, cap - (spent or 0.0)) * share

    iterations = left(total.max_iterations, used.max_iterations)
    minutes = left(total.max_minutes, (used.max_minutes or 0.0) + reserve_minutes)
    tokens = left(total.max_tokens, used.max_tokens)
    return Budget(
        max_iterations=None if iterations is None else max(1, round(iterations)),
        max_minutes=None if minutes is None else max(MIN_MINUTES, minutes),
        max_gpu_seconds=left(total.max_gpu_seconds, used.max_gpu_seconds),
        max_money=left(total.max_money, used.max_money),
        max_tokens=None if tokens is None else max(1, round(tokens)),
    )


def _project(result: VariantResult, simulated: bool) -> None:
    eager = result.eager_us_per_call
    invented = eager / result.best_speedup if result.best_speedup else None
    best = invented if simulated else result.best_latency_us
    if best is None:
        return
    result.projected_us_per_call = min(eager, best)
    result.saving_us = (eager - result.projected_us_per_call) * result.calls


def nothing_worth_searching(manifest: CaptureManifest) -> str:
    """Why a capture leaves nothing to search, in words: its carded variants already run as fast as a kernel could
    make them (or it has none), and where the model's time goes instead."""
    carded = [v for v in manifest.variants if v.status == "card"]
    if carded:
        why = (
            f"nothing worth searching: every carded variant ({', '.join(v.id for v in carded)}) already runs about "
            "as fast as a kernel could make it (k = 1: eager near the copy ceiling or the launch floor)"
        )
    else:
        why = "nothing worth searching: no variant has a card"
    elsewhere = sorted((v for v in manifest.variants if v.status == "unsupported"), key=lambda v: -v.share)[:3]
    if elsewhere:
        why += "; the time is in variants without a card: " + ", ".join(
            f"{v.id} {v.title} {v.share:.1%} ({v.reason.split(':')[0]})" for v in elsewhere
        )
    return why


def _write(report: CaptureOptimizeReport, root: Path) -> None:
    (root / REPORT).write_text(json.dumps(report.model_dump(mode="json"), indent=1) + "\n")


async def optimize_capture(
    capture_dir: Path, settings: Settings, options: CaptureOptimizeOptions, progress: Progress | None = None
) -> CaptureOptimizeReport:
    """Search the capture's variants one after another (best expected saving first) within `options.budget`,
    calling `progress` with the report whenever it changes (a search starts, a new best, a search ends), and writing
    it to CAPTURE_DIR/optimize.json. A variant whose search fails (its baseline does not build, say) is recorded as
    failed with the reason and the next one runs."""
    manifest = load_capture(capture_dir)
    chosen, skipped = plan_variants(manifest, capture_dir, options)
    if not chosen and (options.variants or any(not s.reason.startswith(NOTHING_TO_SAVE) for s in skipped)):
        reasons = "; ".join(f"{s.variant}: {s.reason}" for s in skipped)
        raise BadInput(f"{capture_dir}: no variant to search ({reasons})")
    if not chosen:  # a fact about the model, not a failure: say so in the report
        report = CaptureOptimizeReport(
            capture_dir=capture_dir,
            simulated=options.simulate,
            comparable=False,
            note=nothing_worth_searching(manifest),
            total_time_us=manifest.total_time_us,
            results=[],
            skipped=skipped,
            ended_at=time.time(),
        )
        _write(report, capture_dir)
        (progress or (lambda _: None))(report)
        return report
    gpu_capture = manifest.device.startswith("cuda")
    comparable = options.simulate or gpu_capture
    if options.simulate:
        note = "SIMULATED: the speedups are invented; the projection applies them to the captured eager times"
    elif gpu_capture:
        note = (
            f"eager times captured on {manifest.device_name} ({manifest.timing}); kernel latencies measured with the "
            "L2 flushed before each launch"
        )
    else:
        note = "captured on the CPU: its times cannot be set against GPU latencies; capture on the GPU to project"
    report = CaptureOptimizeReport(
        capture_dir=capture_dir,
        simulated=options.simulate,
        comparable=comparable,
        note=note,
        total_time_us=manifest.total_time_us,
        results=[
            VariantResult(
                variant=v.id,
                title=v.title,
                card=str(v.card),
                expected_saving=v.expected_saving,
                budget=Budget(),
                eager_us_per_call=v.time_per_call_us,
                calls=v.calls,
            )
            for v in chosen
        ],
        skipped=skipped,
    )
    say = progress or (lambda _: None)
    address = options.cluster or settings.cluster.address
    cluster = Cluster(address, settings) if address else None
    try:
        lanes = 1 if cluster is None else min(options.max_gpus or len(chosen), await cluster.wait_for_gpus())
        searches = _Variants(capture_dir, settings, options, chosen, report, say, cluster, lanes)
        await run_lanes(searches.lane() for _ in range(lanes))  # the others' variants recorded as interrupted
    finally:
        if cluster is not None:
            await cluster.close()
    report.ended_at = time.time()
    _write(report, capture_dir)
    say(report)
    return report


class _Variants:
    """The variants' searches, in order of expected saving, on `lanes` lanes: one after another on this machine
    (each on all its GPUs), as many at once as a cluster has GPUs (one GPU each). A search's share is taken when it
    starts, of what the finished searches left and the running ones have not been given; with several lanes the
    minutes are lane-minutes (`lanes` times the wall minutes), so a cluster does more in the same wall time."""

    def __init__(
        self,
        capture_dir: Path,
        settings: Settings,
        options: CaptureOptimizeOptions,
        chosen: list[Variant],
        report: CaptureOptimizeReport,
        say: Callable[[CaptureOptimizeReport], None],
        cluster: Cluster | None,
        lanes: int,
    ) -> None:
        self.capture_dir = capture_dir
        self.settings = settings
        self.options = options
        self.report = report
        self.say = say
        self.cluster = cluster
        self.lanes = lanes
        self.root = options.root or capture_dir / "runs"
        self.queue = iter(enumerate(zip(chosen, report.results, strict=True)))
        self.weights = [max(v.expected_saving, 1e-9) for v in chosen]
        self.used = Budget(max_iterations=0, max_minutes=0.0, max_gpu_seconds=0.0, max_money=0.0, max_tokens=0)
        """What the finished searches spent (minutes: their wall minutes, start-up included)."""
        self.running: dict[int, Budget] = {}
        """The budgets of the searches running now, with their start-up: kept from the ones that start later."""
        self.overheads: list[float] = []
        """Each finished search's wall minutes beyond its own time cap's count, measured."""

    def _share(self, k: int) -> Budget | None:
        """The share of variant `k` (None: a cap is spent), its minutes less its own start-up."""
        overhead = max(self.overheads) if self.overheads else SEARCH_OVERHEAD_MINUTES
        total = self.options.budget
        if total.max_minutes is not None and self.lanes > 1:
            total = total.model_copy(update={"max_minutes": total.max_minutes * self.lanes})
        spent = self.used
        for given in self.running.values():
            minutes = (given.max_minutes or 0.0) + overhead
            spent = _plus(spent, given.model_copy(update={"max_minutes": minutes}))
        later = len(self.weights) - k - 1
        budget = split_budget(total, spent, self.weights[k], sum(self.weights[k:]), later * (overhead + MIN_MINUTES))
        if budget is not None and budget.max_minutes is not None:  # the minutes pay for this search's start-up too
            budget = budget.model_copy(update={"max_minutes": max(MIN_MINUTES, budget.max_minutes - overhead)})
        return budget

    async def lane(self) -> None:
        for k, (variant, result) in self.queue:
            budget = self._share(k)
            if budget is None:
                result.state, result.reason = "not-run", "the budget was spent on the variants before it"
                continue
            result.budget = budget
            self.running[k] = budget
            began = time.monotonic()
            result.state = "running"
            _write(self.report, self.capture_dir)
            self.say(self.report)
            try:
                info = await _search(self, variant, budget, result)
            except (asyncio.CancelledError, NoGpu, FatalLlmError):  # nothing else can run either
                result.state, result.reason = "failed", "interrupted"
                _write(self.report, self.capture_dir)
                raise
            except Exception as exc:  # one variant's failure (a baseline that does not build) must not end the others
                result.state, result.reason = "failed", f"{type(exc).__name__}: {exc}"
            else:
                result.state, result.reason = "finished", info.reason
                self.overheads.append(max(0.0, time.monotonic() - began - info.active_seconds) / 60)
            finally:
                del self.running[k]
            result.wall_seconds = time.monotonic() - began
            spent = Budget(
                max_iterations=result.candidates,
                max_minutes=result.wall_seconds / 60,
                max_gpu_seconds=result.gpu_seconds,
                max_money=result.money_usd,
                max_tokens=result.tokens,
            )
            self.used = _plus(self.used, spent)
            _project(result, self.options.simulate)
            _write(self.report, self.capture_dir)
            self.say(self.report)


def _plus(a: Budget, b: Budget) -> Budget:
    """Two budgets' caps added (None counts as 0)."""
    return Budget(
        max_iterations=(a.max_iterations or 0) + (b.max_iterations or 0),
        max_minutes=(a.max_minutes or 0.0) + (b.max_minutes or 0.0),
        max_gpu_seconds=(a.max_gpu_seconds or 0.0) + (b.max_gpu_seconds or 0.0),
        max_money=(a.max_money or 0.0) + (b.max_money or 0.0),
        max_tokens=(a.max_tokens or 0) + (b.max_tokens or 0),
    )


async def _search(searches: _Variants, variant: Variant, budget: Budget, result: VariantResult) -> RunInfo:
    capture_dir, options, report, say = searches.capture_dir, searches.options, searches.report, searches.say
    card = card_dir(capture_dir, variant)
    load_card(card)  # a broken card fails here, named, before a run directory is made
    run_options = RunOptions(
        root=searches.root,
        budget=budget,
        tree=options.tree,
        proposer=options.proposer,
        strategy=options.strategy,
        simulate=options.simulate,
        simulate_seconds=options.simulate_seconds,
        max_gpus=1 if searches.lanes > 1 else options.max_gpus,  # several at once: one GPU each, as in a bench
        cluster=options.cluster,
    )
    search = prepare_run(card, searches.settings, run_options, cluster=searches.cluster)
    result.run_dir = search.store.run_dir

    def on_best(event: BestImproved) -> None:
        result.best_node = event.node_id
        result.best_speedup = event.speedup
        result.best_latency_us = event.latency_us
        _project(result, options.simulate)
        say(report)

    try:
        info = await run_telling_bests(search, on_best)
    finally:
        totals = search.store.llm_totals()
        result.money_usd, result.tokens = totals.cost_usd, totals.tokens
        search.store.close()
    result.best_node = info.best_node_id
    result.best_speedup = info.best_speedup
    result.best_latency_us = info.best_latency_us
    result.candidates = max(0, info.node_count - 1)
    result.gpu_seconds = info.gpu_seconds
    return info
