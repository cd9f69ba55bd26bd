"""`kernelforge bench`: the suite's cards searched in turn, one per GPU at a time, each its own run, resumable after a
kill.

One run per card, because a card is what the search, the store, the TUI and `kernelforge show` already understand:
every card's search can be opened, steered, resumed and exported like any other run, and the bench only decides
what runs next and keeps the numbers. The manifest (`bench.json`) is rewritten atomically after every change and
has one writer (the cards' searches are tasks of one event loop), so a bench killed at any moment resumes where it
was. Each card's search is pinned to its own GPU; a task's minutes are shared among its cards as
`capture_search.split_budget` shares a capture's, so that several GPUs divide the wall time. The vendor is timed in
a subprocess per GPU lane (`VendorTimer`), since torch is an optional extra and a faulting vendor call must not end
the bench. The manifest's file, the one-writer lock and a card's search or resume in its run directory are
functions of their own (`read_manifest`, `bench_lock`, `search_card`), so that a bench script with its own table
(bench/vs_torch.py) resumes as this one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from kernelforge_tui.atomic import write_atomic
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.config import Settings
from kernelforge_tui.engine.backend import EvaluationBackend, GpuBackend, SimulatedBackend, make_builder
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.capture_search import MIN_MINUTES, SEARCH_OVERHEAD_MINUTES, split_budget
from kernelforge_tui.engine.cluster.backend import Cluster, ClusterBackend, time_vendor
from kernelforge_tui.engine.feedback import cannot_serve
from kernelforge_tui.engine.setup import (
    DEFAULT_PROPOSER,
    RunOptions,
    load_proposer,
    prepare_run,
    run_lanes,
    run_telling_bests,
)
from kernelforge_tui.engine.vendor_timer import VendorTimer
from kernelforge_tui.errors import BadInput, NoGpu
from kernelforge_tui.gpu.detect import detect_gpus
from kernelforge_tui.gpu.evaluate import cached_ceilings
from kernelforge_tui.gpu.statistics import robust_stats
from kernelforge_tui.store import DB_NAME, RunStore, StoreError
from kernelforge_tui.store.lock import take_writer_lock
from kernelforge_tui.suite import cards as suite_cards
from kernelforge_tui.suite.registry import select, task
from kernelforge_tui.suite.score import CardResult, Status, roofline_us
from kernelforge_tui.suite.task import PRECISIONS, Precision
from kernelforge_tui.suite.vendor_timing import VendorReply, VendorRequest
from kernelforge_tui.vocabulary.evaluation import Ceilings
from kernelforge_tui.vocabulary.events import BestImproved
from kernelforge_tui.vocabulary.runs import RunInfo

MANIFEST = "bench.json"
CARDS = "cards"
RUNS = "runs"
REPORT = "report"
DEFAULT_MINUTES_PER_TASK = 2.0
"""Wall minutes per task, over its cards, when none is given: the 50-task suite in a little under two hours."""
VENDOR_REPS = 100
NO_TEMPLATE = "no template"
SIMULATED_VENDOR = "not timed: a simulated bench runs nothing on a GPU"
M = TypeVar("M", bound=BaseModel)

CardState = Literal["pending", "running", "finished", "no-template", "failed", "not-run"]
DONE: tuple[CardState, ...] = ("finished", "no-template", "failed", "not-run")
STATUS: dict[CardState, Status] = {"finished": "searched", "no-template": "no-template", "failed": "failed"}
"""A card's state as the score reads it (a card not done yet is "not-run")."""


class BenchOptions(BaseModel):
    """What `kernelforge bench` was given."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(default_factory=list)
    """Glob patterns over task names (every task when empty)."""
    precisions: list[Precision] = Field(default_factory=lambda: list(PRECISIONS))
    scales: list[int] = Field(default_factory=list)
    """Scales (elements of the main tensor) to run; every scale of each task when empty."""
    proposer: str = DEFAULT_PROPOSER
    minutes_per_task: float | None = Field(default=DEFAULT_MINUTES_PER_TASK, ge=0)
    iterations: int | None = Field(default=None, ge=0)
    """Candidates per card at most (None: no cap)."""
    simulate: bool = False
    simulate_seconds: float = Field(default=0.01, ge=0)
    max_gpus: int | None = Field(default=None, ge=1)
    """`--gpus N`: cards run at once, each pinned to its own GPU (None: every GPU detected; 1 without one or
    simulated)."""
    cluster: str | None = None
    """A Dask scheduler's address: the cards' searches spread over its GPU workers (as many at once as it has GPUs,
    or `--gpus`), the runs, the manifest and the report here."""


class VendorResult(BaseModel):
    """The vendor library's time and agreement on one card."""

    library: str
    median_us: float | None = None
    cv: float | None = None
    reps: int = 0
    agrees: bool | None = None
    note: str = ""
    """What the check found, or why nothing was timed."""


class BenchCard(BaseModel):
    """One card of the bench: where its search is and what it measured."""

    card: str
    task: str
    family: str
    precision: Precision
    scale: int
    flops: int
    bytes: int
    state: CardState = "pending"
    reason: str = ""
    """The search's reason for ending, a failure, or "no template: <why>"."""
    run_dir: Path | None = None
    budget: Budget | None = None
    wall_seconds: float = 0.0
    """Spent on the card in every session of the bench (start-up and closing included)."""
    gpu: int | None = None
    """The GPU (nvidia-smi's index; a simulated bench's lane) its run was last searched on."""
    started_at: float | None = None
    ended_at: float | None = None
    """When the bench last took the card up and let it go (Unix time): cards on several GPUs overlap."""
    active_seconds: float = 0.0
    """What the run's own clock counted (the rest is start-up and closing)."""
    candidates: int = 0
    best_node: int | None = None
    best_speedup: float | None = None
    improved: bool | None = None
    """Whether a candidate beat the baseline (the promoted best is not the baseline itself)."""
    baseline_us: float | None = None
    best_us: float | None = None
    vendor: VendorResult | None = None

    @property
    def log2_scale(self) -> int:
        return self.scale.bit_length() - 1


class BenchManifest(BaseModel):
    """`bench.json`: the bench's cards in the order they run, as they go."""

    format_version: Literal[1] = 1
    options: BenchOptions
    gpu_name: str = ""
    ceilings: Ceilings | None = None
    """The GPU's measured ceilings (copy bandwidth, FMA rate), as the worker measured them."""
    simulated_ceiling_us: float | None = None
    """A simulated bench's invented ceiling: the simulated backend's baseline time over its top speedup."""
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    gpus: int = 1
    """Cards the latest session ran at once (one per GPU)."""
    cards: list[BenchCard] = Field(default_factory=list)

    @property
    def simulated(self) -> bool:
        return self.options.simulate

    def task_cards(self, name: str) -> list[BenchCard]:
        return [c for c in self.cards if c.task == name]

    def minutes_left(self) -> float | None:
        """At most how many minutes the cards not done yet may take (None without a minutes budget)."""
        per_task = self.options.minutes_per_task
        if per_task is None:
            return None
        left = 0.0
        for name in dict.fromkeys(c.task for c in self.cards):
            mine = self.task_cards(name)
            if all(c.state in DONE for c in mine):
                continue
            left += max(0.0, per_task - sum(c.wall_seconds for c in mine) / 60)
        return left


Progress = Callable[[BenchManifest, str], None]
"""Told the manifest and a line saying what changed (a card started, a new best, a card done)."""


def manifest_path(out: Path) -> Path:
    return out / MANIFEST


def read_manifest(path: Path, model: type[M], makes_it: str) -> M:
    """A bench's manifest (this bench's or a script's own model of one); BadInput when there is none, saying the
    command that `makes_it`, or when it does not read."""
    try:
        return model.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path.parent} holds no bench ({path.name} is missing): run `{makes_it}` first") from None
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON, not the model (ValidationError)
        raise BadInput(f"{path} does not read as a bench manifest: {exc}") from None


def write_manifest(path: Path, manifest: BaseModel) -> None:
    """Written under a temporary name and renamed into place: a kill never leaves half a manifest."""
    write_atomic(path, manifest.model_dump_json(indent=1) + "\n")


def load_manifest(out: Path) -> BenchManifest:
    """The bench recorded in `out`; BadInput when there is none or it does not read."""
    return read_manifest(manifest_path(out), BenchManifest, f"kernelforge bench -o {out}")


def save_manifest(manifest: BenchManifest, out: Path) -> None:
    write_manifest(manifest_path(out), manifest)


@contextlib.contextmanager
def bench_lock(out: Path) -> Iterator[None]:
    """`out` made and held by this process while its bench runs, so that its manifest has one writer; BadInput
    while another process runs it."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        lock = take_writer_lock(out)
    except StoreError as exc:
        raise BadInput(f"bench {out}: another process runs it ({exc})") from None
    try:
        yield
    finally:
        os.close(lock)


def plan_cards(options: BenchOptions) -> list[BenchCard]:
    """The cards the options select, task by task (suite order), each task's precisions then scales; BadInput for a
    pattern matching no task or a scale no selected task runs at."""
    try:
        tasks = select(options.tasks)
    except KeyError as exc:
        raise BadInput(str(exc.args[0])) from None
    wanted = set(options.scales)
    unknown = wanted - {s for t in tasks for s in t.scales}
    if unknown:
        logs = ", ".join(str(s.bit_length() - 1) for s in sorted(unknown))
        raise BadInput(f"--scales {logs}: no selected task runs at 2^{logs.replace(', ', ', 2^')} elements")
    planned: list[BenchCard] = []
    for t in tasks:
        for precision in (p for p in PRECISIONS if p in options.precisions and p in t.precisions):
            for scale in (s for s in t.scales if not wanted or s in wanted):
                spec = suite_cards.spec(t, precision, scale)
                planned.append(
                    BenchCard(
                        card=spec.name,
                        task=t.name,
                        family=t.family,
                        precision=precision,
                        scale=scale,
                        flops=spec.flops(),
                        bytes=spec.bytes_moved(),
                    )
                )
    if not planned:
        raise BadInput("the selection has no card: no selected task runs at the chosen precision")
    return planned


def open_manifest(out: Path, options: BenchOptions, planned: list[BenchCard]) -> BenchManifest:
    """The bench in `out` continued with these options (the `planned` cards not recorded yet are added after the
    recorded ones), or a new one. A bench is simulated or measured, with one proposer, from start to end."""
    if not manifest_path(out).exists():
        return BenchManifest(options=options, cards=planned)
    manifest = load_manifest(out)
    recorded = manifest.options
    if recorded.simulate != options.simulate:
        was = "simulated" if recorded.simulate else "measured on a GPU"
        raise BadInput(
            f"the bench in {out} was {was}: rerun it {'with' if recorded.simulate else 'without'} --simulate, or "
            "give another -o (one bench never mixes simulated and measured timings)"
        )
    if recorded.proposer != options.proposer:
        raise BadInput(
            f"the bench in {out} searches with --proposer {recorded.proposer}: rerun it so, or give another -o"
        )
    known = {c.card for c in manifest.cards}
    manifest.cards += [c for c in planned if c.card not in known]
    for card in manifest.cards:
        if card.state == "running":  # in flight when the last session ended: nothing runs it now
            card.state = "pending"
    manifest.options = options
    manifest.ended_at = None
    return manifest


def results(manifest: BenchManifest) -> list[CardResult]:
    """The manifest's cards as the score reads them (the roofline from the bench's ceilings)."""
    out: list[CardResult] = []
    for c in manifest.cards:
        status = STATUS.get(c.state, "not-run")
        roof = None
        if manifest.ceilings is not None:
            roof = roofline_us(c.flops, c.bytes, manifest.ceilings, c.precision)
        elif manifest.simulated:
            roof = manifest.simulated_ceiling_us
        vendor = c.vendor
        out.append(
            CardResult(
                task=c.task,
                family=c.family,
                precision=c.precision,
                scale=c.scale,
                flops=c.flops,
                bytes=c.bytes,
                status=status,
                baseline_us=c.baseline_us,
                best_us=c.best_us,
                roofline_us=roof,
                vendor=vendor.library if vendor else None,
                vendor_us=vendor.median_us if vendor else None,
                vendor_agrees=vendor.agrees if vendor else None,
                note=c.reason if c.state != "finished" else "",
            )
        )
    return out


async def run_bench(
    out: Path, settings: Settings, options: BenchOptions, progress: Progress | None = None
) -> BenchManifest:
    """Run (or continue) the bench in `out`: every selected card searched in turn, the manifest saved after each
    change. NoGpu and a cancellation end it (the card in progress stays resumable); a card's own failure (its
    baseline does not build or pass) is recorded and the next card runs."""
    with bench_lock(out):
        planned = plan_cards(options)
        bench = _Bench(out, settings, open_manifest(out, options, planned), progress)
        await bench.run({c.card for c in planned})
        return bench.manifest


class _Bench:
    def __init__(self, out: Path, settings: Settings, manifest: BenchManifest, progress: Progress | None) -> None:
        self.out = out
        self.settings = settings
        self.manifest = manifest
        self.progress = progress or (lambda _m, _line: None)
        self.cluster: Cluster | None = None
        """The Dask cluster the searches share (with `--cluster`): one connection, one pool of GPUs."""

    def say(self, line: str) -> None:
        """Save, then tell the view: synchronous, so no other card's change comes between (the one writer)."""
        save_manifest(self.manifest, self.out)
        self.progress(self.manifest, line)

    async def devices(self) -> list[int | None]:
        """The GPUs cards run on, one card each at a time: `--gpus N` of those detected, numbered lanes in a simulated
        bench or on a cluster (as many as its GPUs), and [None] where none is detected (the card's search then says
        why it cannot run)."""
        wanted = self.manifest.options.max_gpus
        if self.cluster is not None:
            gpus = await self.cluster.wait_for_gpus()  # connects: a bad address ends the bench before any card
            return list(range(wanted or gpus))
        if self.manifest.simulated:
            return list(range(wanted or 1))
        found: list[int | None] = [gpu.index for gpu in detect_gpus()]
        return found[: wanted or len(found)] or [None]

    async def run(self, selected: set[str]) -> None:
        """Run the selected cards not done yet, in order, as many at once as there are GPUs (the manifest's other
        cards stay as they are, in the report)."""
        address = self.manifest.options.cluster or self.settings.cluster.address
        self.cluster = Cluster(address, self.settings) if address else None
        try:
            await self._run(selected)
        finally:
            if self.cluster is not None:
                await self.cluster.close()

    async def _run(self, selected: set[str]) -> None:
        devices = await self.devices()
        self.manifest.gpus = len(devices)
        done = sum(c.state in DONE for c in self.manifest.cards)
        self.say(f"bench {self.out}: {done} of {len(self.manifest.cards)} cards done; {self._spread(devices)}")
        queue = iter([c for c in self.manifest.cards if c.state not in DONE and c.card in selected])
        overheads: list[float] = []
        await run_lanes(self._lane(device, queue, overheads) for device in devices)  # a refused run ends them all
        if self.cluster is None and not self.manifest.simulated and self.manifest.ceilings is None:  # all done before
            self.manifest.ceilings = next(filter(None, (cached_ceilings(gpu.uuid) for gpu in detect_gpus())), None)
        self.manifest.ended_at = time.time()
        self.say(f"bench {self.out}: done")

    def _spread(self, devices: list[int | None]) -> str:
        wanted = self.manifest.options.max_gpus
        if devices == [None]:
            return "no GPU detected"
        if self.cluster is not None:
            simulated = " (simulated)" if self.manifest.simulated else ""
            return f"{len(devices)} cards at once on the Dask cluster at {self.cluster.address}{simulated}"
        kind = "simulated GPU" if self.manifest.simulated else "GPU"
        fewer = f" (--gpus {wanted}: only {len(devices)} here)" if wanted is not None and wanted > len(devices) else ""
        if len(devices) == 1:
            return f"one card at a time, on {kind} {devices[0]}{fewer}"
        return f"{len(devices)} cards at once, one on each of {kind}s {', '.join(map(str, devices))}{fewer}"

    async def _lane(self, device: int | None, queue: Iterator[BenchCard], overheads: list[float]) -> None:
        """One GPU's share: the next card nobody has taken, searched there, until none is left."""
        vendor = VendorTimer(device)  # started at its first request: never on a cluster
        try:
            for card in queue:
                began = time.monotonic()
                card.started_at, card.ended_at = time.time(), None
                try:
                    await self._card(card, overheads, device, vendor)
                finally:
                    card.wall_seconds += time.monotonic() - began
                    card.ended_at = time.time()
                    save_manifest(self.manifest, self.out)
                if card.state == "finished" and card.budget is not None and card.budget.max_minutes is not None:
                    overheads.append(max(0.0, card.wall_seconds - card.active_seconds) / 60)
        finally:
            await vendor.close()

    def _budget(self, card: BenchCard, overheads: list[float]) -> Budget | None:
        """The card's share of its task's minutes left (None when they are spent), with the per-card iteration cap.
        The task's cards running on other GPUs count as spending their whole share (minutes and start-up)."""
        options = self.manifest.options
        if options.minutes_per_task is None:
            return Budget(max_iterations=options.iterations)
        mine = self.manifest.task_cards(card.task)
        overhead = max(overheads) if overheads else SEARCH_OVERHEAD_MINUTES
        running = [c for c in mine if c.state == "running"]
        left = [c for c in mine if c.state not in (*DONE, "running") and self._unserved(c) is None]  # others: free
        spent = sum(c.wall_seconds for c in mine if c.state != "running") / 60
        spent += sum(_reserved_minutes(c, overhead) for c in running)
        total = Budget(max_minutes=options.minutes_per_task)
        budget = split_budget(
            total, Budget(max_minutes=spent), 1.0, len(left), (len(left) - 1) * (overhead + MIN_MINUTES)
        )
        if budget is None or budget.max_minutes is None:
            return None
        minutes = max(MIN_MINUTES, budget.max_minutes - overhead)  # the minutes pay for the search's start-up too
        return Budget(max_minutes=minutes, max_iterations=options.iterations)

    def _unserved(self, card: BenchCard) -> str | None:
        """Why the bench's template proposer has nothing for the card ("no template: ..."); None when it has, or
        when the proposer is not the template library."""
        if self.manifest.options.proposer != DEFAULT_PROPOSER:
            return None
        why = cannot_serve(
            load_proposer(DEFAULT_PROPOSER), suite_cards.spec(task(card.task), card.precision, card.scale)
        )
        return None if why is None else f"{NO_TEMPLATE}: the templates proposer {why}"

    async def _card(self, card: BenchCard, overheads: list[float], device: int | None, vendor: VendorTimer) -> None:
        """The card on `device`: not searched (no template, no minutes left), searched or resumed, then collected
        and its vendor timed there."""
        written = suite_cards.write(task(card.task), card.precision, card.scale, self.out / CARDS)
        unserved = self._unserved(card)
        if unserved is not None:
            card.state, card.reason = "no-template", unserved
            self.say(f"{card.card}: {card.reason}")
            return
        self._note_roof(written)
        run_dir = self.out / RUNS / card.card
        card.run_dir = run_dir
        card.gpu = device if self.cluster is None else None  # on a cluster, each candidate's run says which GPU
        info = recorded(run_dir)
        if info is None or info.state != "finished":
            if info is None:
                card.budget = self._budget(card, overheads)
                if card.budget is None:
                    card.state, card.reason = "not-run", "its task's minutes were spent on the cards before it"
                    self.say(f"{card.card}: not run ({card.reason})")
                    return
            card.state = "running"
            self.say(f"{_on(card)}: {'resuming its run' if info else 'searching'}" + _caps(card.budget))
            try:
                card.reason = await self._search(card, written, run_dir, resume=info is not None)
            except (asyncio.CancelledError, NoGpu, BadInput):
                raise  # BadInput: a new run refused as given (an LLM proposer without [llm]): so would every card
            except Exception as exc:  # this card's failure (its baseline does not build) must not end the others
                card.state, card.reason = "failed", f"{type(exc).__name__}: {exc}"
                self.say(f"{_on(card)}: failed ({card.reason})")
                return
        self._collect(card, run_dir)
        await self._vendor(card, written, vendor)
        card.state = "finished"
        best = f"{card.best_speedup:.3g}x" if card.best_speedup is not None else "-"
        self.say(f"{_on(card)}: finished, best {best} ({card.reason})")

    def _note_roof(self, card: Card) -> None:
        """The simulated bench's invented ceiling, known before any search (the GPU's comes from its workers)."""
        if self.manifest.simulated and self.manifest.simulated_ceiling_us is None:
            backend = SimulatedBackend(card, make_builder(self.settings))
            self.manifest.simulated_ceiling_us = backend.baseline_us / backend.max_speedup
            self.manifest.gpu_name = backend.gpu_name

    async def _search(self, card: BenchCard, written: Card, run_dir: Path, resume: bool) -> str:
        options = self.manifest.options
        run_options = RunOptions(
            budget=card.budget or Budget(),
            proposer=options.proposer,
            simulate=options.simulate,
            simulate_seconds=options.simulate_seconds,
            gpus=None if card.gpu is None else [card.gpu],
            max_gpus=1 if self.cluster is not None else None,  # one card per GPU, as on one machine
        )

        def on_best(event: BestImproved) -> None:
            card.best_speedup = event.speedup
            self.say(f"{_on(card)}: best {event.speedup:.3g}x (node {event.node_id})")

        end = await search_card(
            written.root, run_dir, self.settings, run_options, on_best, self._note_gpu, resume, self.cluster
        )
        return end.reason

    def _note_gpu(self, backend: EvaluationBackend) -> None:
        if isinstance(backend, GpuBackend):
            self.manifest.gpu_name = backend.gpu_name
            self.manifest.ceilings = gpu_ceilings(backend) or self.manifest.ceilings
        elif isinstance(backend, ClusterBackend):
            self.manifest.gpu_name = f"Dask cluster at {backend.cluster.address}"
            self.manifest.ceilings = self.manifest.ceilings or backend.ceilings

    def _collect(self, card: BenchCard, run_dir: Path) -> None:
        """The run's promoted best and the baseline timed beside it."""
        with RunStore.open(run_dir, readonly=True) as store:
            info = store.run_info()
            card.reason = card.reason or info.reason
            card.candidates = max(0, info.node_count - 1)
            card.active_seconds = info.active_seconds
            card.best_node, card.best_speedup = info.best_node_id, info.best_speedup
            if info.best_node_id is None:
                return
            card.improved = store.node(info.best_node_id).parent_id is not None
            evaluation = store.evaluation(info.best_node_id)
        result = evaluation.result if evaluation is not None else None
        if result is not None and result.candidate is not None and result.baseline is not None:
            card.best_us, card.baseline_us = result.candidate.median_us, result.baseline.median_us
        elif info.best_latency_us is not None and info.best_speedup is not None:
            card.best_us, card.baseline_us = info.best_latency_us, info.best_latency_us * info.best_speedup

    async def _vendor(self, card: BenchCard, written: Card, timer: VendorTimer) -> None:
        vendor = task(card.task).vendor
        if vendor is None or card.vendor is not None:
            return
        if self.manifest.simulated:
            card.vendor = VendorResult(library=vendor.library, note=SIMULATED_VENDOR)
            return
        self.say(f"{_on(card)}: timing {vendor.library}")
        request = VendorRequest(
            card_dir=written.root,
            reps=VENDOR_REPS,
            flush_bytes=self.settings.eval.flush_bytes,
        )  # "cuda": the timer's process sees the lane's GPU only
        if self.cluster is not None:
            reply = await time_vendor(self.cluster, written, request)
        else:
            reply = await timer.time(request)
        card.vendor = vendor_result(vendor.library, reply)


def _on(card: BenchCard) -> str:
    """The card and the GPU it runs on, for the progress lines."""
    return card.card if card.gpu is None else f"{card.card} on GPU {card.gpu}"


def _reserved_minutes(card: BenchCard, overhead: float) -> float:
    """What a card running now will have spent of its task's minutes: its share and start-up, or more if it has
    already spent more (in earlier sessions)."""
    share = card.budget.max_minutes if card.budget is not None and card.budget.max_minutes is not None else 0.0
    return max(card.wall_seconds / 60, share + overhead)


def _caps(budget: Budget | None) -> str:
    caps = budget.model_dump(exclude_none=True) if budget is not None else {}
    shown = ", ".join(f"{k.removeprefix('max_')} {v:.3g}" for k, v in caps.items())
    return f" (budget: {shown})" if shown else ""


def recorded(run_dir: Path) -> RunInfo | None:
    """A bench's run of a card as its store records it; None when there is none (or only a damaged one, started
    afresh)."""
    if not (run_dir / DB_NAME).is_file():
        return None
    try:
        with RunStore.open(run_dir, readonly=True) as store:
            return store.run_info()
    except StoreError:
        return None


@dataclass(frozen=True)
class SearchEnd:
    """How a bench's search of one card ended."""

    reason: str
    """Why the search ended, or (`refused`) why the recorded run was not resumed."""
    refused: bool = False
    """The recorded run was not resumed (a cap it spent, another kind of backend): its results so far stand."""


async def search_card(
    card_dir: Path,
    run_dir: Path,
    settings: Settings,
    options: RunOptions,
    on_best: Callable[[BestImproved], None],
    on_end: Callable[[EvaluationBackend], None],
    resume: bool,
    cluster: Cluster | None = None,
) -> SearchEnd:
    """A bench's search of one card, to its end, in `run_dir`: a new run under `options` or (`resume`) the recorded
    run continued with no caps of its own. `on_best` is told each new best; `on_end` is given the backend however
    the search ends, so that a search cut short still says which GPU it ran on and what it measured there.

    A new run refused as given raises BadInput (so would every card be); a refused resume is a SearchEnd."""
    if not resume and run_dir.exists():
        shutil.rmtree(run_dir)  # a run that never got its store (killed while being created): start afresh
    run_options = options.model_copy(
        update={
            "resume": str(run_dir) if resume else None,
            "run_dir": None if resume else run_dir,
            "root": run_dir.parent,
            "budget": Budget() if resume else options.budget,
        }
    )
    try:
        search = prepare_run(card_dir, settings, run_options, cluster=cluster)
        try:
            info = await run_telling_bests(search, on_best)
        finally:
            on_end(search.backend)
            search.store.close()
    except BadInput as exc:
        if not resume:
            raise
        return SearchEnd(f"not resumed ({exc}): its results so far stand", refused=True)
    return SearchEnd(info.reason)


def gpu_ceilings(backend: EvaluationBackend) -> Ceilings | None:
    """The ceilings a search's GPU workers measured; None before they did, or on a backend with no GPU of its own."""
    if not isinstance(backend, GpuBackend):
        return None
    return next((e.ceilings for e in backend.evaluators if e.ceilings is not None), None)


def vendor_result(library: str, reply: VendorReply) -> VendorResult:
    """The reply summarised with the worker's statistics (the median of every timed call, its spread)."""
    result = VendorResult(library=reply.library or library, agrees=reply.agrees, note=reply.error or reply.check)
    if reply.samples_us:
        timing = robust_stats(reply.samples_us)
        result.median_us, result.cv, result.reps = timing.median_us, timing.cv, timing.reps
    return result
