"""Setting up a run: the one place `kernelforge optimize`, `kernelforge tui` and `kernelforge profile` (and the
engine benchmark) get a run from, new or resumed.

Why one place: the CLI and the TUI are two views of the same engine, so they must build its parts the
same way: the card, the proposer by name, the backend (the GPUs, or the simulation), the settings a run
records, its store, and on a resume the same card, settings and kind of backend the run started with.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import shlex
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernelforge_tui.cards import load_card
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.config import LlmSettings, Settings, config_file, pricing_line
from kernelforge_tui.engine.backend import SIMULATED, GpuBackend, SimulatedBackend, make_builder
from kernelforge_tui.engine.budget import CAP_OPTIONS, Budget, BudgetUsage
from kernelforge_tui.engine.cluster.backend import Cluster, ClusterBackend
from kernelforge_tui.engine.cluster.remote import Simulation
from kernelforge_tui.engine.router import past_records, rank_coders
from kernelforge_tui.engine.search import Search
from kernelforge_tui.engine.settings import PipelineSettings, RunSettings
from kernelforge_tui.engine.tree import TreeSettings
from kernelforge_tui.errors import BadInput
from kernelforge_tui.gpu.detect import NoGpuError, require_gpu
from kernelforge_tui.llm import LlmClient
from kernelforge_tui.proposers.base import Proposer
from kernelforge_tui.store import RunStore, new_run_dir, resolve_run
from kernelforge_tui.vocabulary.events import BestImproved, BudgetUsed
from kernelforge_tui.vocabulary.runs import RunInfo

DEFAULT_PROPOSER = "templates"
LLM_PROPOSERS = ("agents", "hybrid")
"""Proposers that write with an LLM team (`[llm]` in the config)."""

M = TypeVar("M", bound=BaseModel)


class RunOptions(BaseModel):
    """What a command gives a run on top of the user's Settings. On a resume, a budget cap given here replaces
    the recorded one, and `tree`, `proposer` and `strategy` (when given) replace what the run recorded."""

    model_config = ConfigDict(extra="forbid")

    resume: str | None = None
    """A run (its directory, or its id under `root`) to continue instead of starting a new one."""
    run_dir: Path | None = None
    """Where a new run's store goes (default: a new directory under `root`)."""
    root: Path | None = None
    """The runs root (default: the data dir's runs/)."""
    budget: Budget = Field(default_factory=Budget)
    tree: dict[str, str] = Field(default_factory=dict)
    """TreeSettings fields to override (`--tree exploration=0.7`), checked by the TreeSettings model."""
    proposer: str | None = None
    strategy: str | None = None
    simulate: bool = False
    """No GPU: real nvcc builds, invented timings."""
    simulate_seconds: float = 0.01
    """Simulated GPU seconds per evaluation."""
    max_gpus: int | None = Field(default=None, ge=1)
    """Use at most this many of the visible GPUs (default: all)."""
    gpus: list[int] | None = None
    """Use only the GPUs with these indices (nvidia-smi's; default: all), e.g. one card per GPU in a bench."""
    cluster: str | None = None
    """A Dask scheduler's address (tcp://host:8786): builds and evaluations on its workers, the store here. Default:
    `[cluster] address` of the settings, else this machine's GPUs."""


@dataclass(frozen=True)
class RecordedRun:
    """An existing run as its store records it (read without taking it over)."""

    run_dir: Path
    card_dir: Path
    """Where the card was when the run started (a resume and a profile load it from there)."""
    settings: RunSettings
    info: RunInfo


def recorded_run(run: str, root: Path | None = None) -> RecordedRun:
    """The run named by `run` (a directory, or an id under `root`), read-only: StoreError when there is none."""
    with RunStore.open(resolve_run(run, root), readonly=True) as store:
        return _recorded(store)


def _recorded(store: RunStore) -> RecordedRun:
    """What a viewer's store, or a resuming writer's (read under its lock), records."""
    return RecordedRun(store.run_dir, store.card_dir(), store.settings(RunSettings), store.run_info())


def prepare_run(
    card_dir: Path | None, settings: Settings, options: RunOptions, cluster: Cluster | None = None
) -> Search:
    """A search ready to `run()` on a new run of the card in `card_dir`, or (`options.resume`) on the recorded
    run continued (`card_dir` then only says where the card moved); the caller closes `search.store`. `cluster`: a
    connection the caller shares between several searches (a bench), instead of the options' address.

    BadInput for what cannot run as given; NoGpuError when no GPU can evaluate (found out before a new run's
    directory is made, so none is left behind). A resume becomes the run's one writer first, so a run live
    elsewhere or damaged is refused as such (StoreError) on any machine, before the card and the GPUs."""
    store = RunStore.resume(resolve_run(options.resume, options.root)) if options.resume else None
    try:
        if store is not None:
            recorded = _recorded(store)
            _same_backend(recorded.info, options.simulate)
            card = load_card(card_dir or recorded.card_dir)
            run_settings = _resumed_settings(recorded.settings, options)
        elif card_dir is None:
            raise BadInput("give a CARD directory, or --resume RUN")
        else:
            card = load_card(card_dir)
            run_settings = new_run_settings(settings, options)
        proposer, llm = make_proposer(run_settings.proposer, settings.llm, card.spec.family, options.root)
        if llm is not None and run_settings.budget.max_money is not None:
            _all_priced(settings.llm)
        if llm is not None:
            pipeline = run_settings.pipeline.model_copy(update={"max_expanding": settings.llm.agents.expansions})
            run_settings = run_settings.model_copy(update={"pipeline": pipeline})
        backend = make_backend(card, settings, options, resumed=store is not None, cluster=cluster)
        if store is not None:
            store.set_settings(run_settings)
        else:
            run_dir = options.run_dir or new_run_dir(card.spec.name, options.root)
            store = RunStore.create(run_dir, card, backend.name, backend.gpu_name, run_settings)
        search = Search(
            card, proposer, backend, store, run_settings, profile=settings.profile, reward=settings.reward, llm=llm
        )
        if options.resume:
            _budget_left(search)
        return search
    except BaseException:
        if store is not None:
            store.close()
        raise


async def run_telling_bests(search: Search, on_best: Callable[[BestImproved], None]) -> RunInfo:
    """`search.run()` with `on_best` told each new best as it comes (the progress of a bench or a capture's
    searches, which hold no view of their own)."""
    events = search.subscribe()

    async def follow() -> None:
        while True:
            event = await events.get()
            if isinstance(event, BestImproved):
                on_best(event)

    follower = asyncio.create_task(follow())
    try:
        return await search.run()
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower


async def run_lanes(lanes: Iterable[Coroutine[object, object, None]]) -> None:
    """Searches side by side, one lane (a task) per GPU taking work from a shared queue, until every lane ends.
    One lane's end by an error or a cancellation (NoGpu, Ctrl-C) is raised and ends the others, their searches
    left resumable."""
    tasks = [asyncio.create_task(lane) for lane in lanes]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _all_priced(llm: LlmSettings) -> None:
    """A money budget counts what each call costs: a model the team calls without a price would cost nothing
    against it, so the run is refused before it starts, with the line that prices each such model."""
    unpriced = llm.unpriced(llm.used_models())
    if unpriced:
        names = ", ".join(f"{m.name} ({m.model} at {m.provider})" for m in unpriced)
        lines = "; ".join(pricing_line(m.model) for m in unpriced)
        raise BadInput(
            f"--budget-money needs a price for every model the team calls; none for {names}: add under "
            f"[llm.pricing] in {config_file()}: {lines} (the provider's US dollars per million tokens; 0 for a "
            "local server), or give the model its own price"
        )


def _budget_left(search: Search) -> None:
    """A resumed run that already spent a cap would stop at once: refused, saying which cap to raise (caps are the
    run's totals, so the new one must be above what was spent)."""
    reached = search.meter.reached()
    if reached is None:
        return
    field, reason = reached
    info = search.store.run_info()
    raise BadInput(
        f"run {info.run_id} has spent its budget ({reason}): caps are totals for the run, so continue it with a "
        f"larger one, e.g. {CAP_OPTIONS[field]} {_larger(search.meter.usage, field)}"
    )


def _larger(usage: BudgetUsage, field: str) -> str:
    """A cap above what the run spent: about double, for the message's example."""
    spent = {
        "max_iterations": usage.iterations,
        "max_minutes": usage.elapsed_s / 60,
        "max_gpu_seconds": usage.gpu_seconds,
        "max_money": usage.money,
        "max_tokens": usage.tokens,
    }[field]
    if field in ("max_iterations", "max_tokens"):
        return str(max(1, int(spent) * 2))
    return f"{max(1.0, spent * 2):.0f}"


def resume_command(info: RunInfo, spent: BudgetUsed | None = None) -> str:
    """The command that continues a run, as the CLI's and the TUI's closing lines give it: `--simulate` for a simulated
    run (a resume without it is refused), and where the run stopped at a cap (`spent`: its last budget standing) a
    larger one (caps are the run's totals: the same cap would be refused)."""
    command = f"kernelforge optimize --resume {shlex.quote(str(info.run_dir))}"
    if info.backend == SIMULATED:
        command += " --simulate"
    if spent is None:
        return command
    usage = BudgetUsage(  # the run's clocks as a resume restores them, the rest as last counted
        iterations=spent.iterations,
        elapsed_s=info.active_seconds,
        gpu_seconds=info.gpu_seconds,
        money_nanousd=round(spent.money_usd * 1e9),
        tokens=spent.tokens,
    )
    caps = Budget(
        max_iterations=spent.max_iterations,
        max_minutes=None if spent.max_seconds is None else spent.max_seconds / 60,
        max_gpu_seconds=spent.max_gpu_seconds,
        max_money=spent.max_money_usd,
        max_tokens=spent.max_tokens,
    )
    reached = usage.reached(caps)
    return command if reached is None else f"{command} {CAP_OPTIONS[reached[0]]} {_larger(usage, reached[0])}"


def stored_resume_command(run_dir: Path) -> str:
    """`resume_command` for a run at rest, read from its store (its last budget event says what it spent)."""
    with RunStore.open(run_dir, readonly=True) as store:
        info, spent = store.run_info(), store.last_event("budget")
    return resume_command(info, spent if isinstance(spent, BudgetUsed) else None)


def continue_note(info: RunInfo) -> str | None:
    """How to continue a run that is over (finished, stopped or interrupted); None for one still live."""
    if info.state not in ("finished", "interrupted"):
        return None
    run = str(info.run_dir)
    where = "" if info.backend == SIMULATED else " on a machine with a GPU"
    return (
        f"run {info.run_id} is {info.state}: continue it here with `kernelforge open {run} --resume`{where} (a cap "
        f"it has spent needs a larger one, e.g. --budget-minutes 10), or with `{resume_command(info)}`"
    )


def new_run_settings(settings: Settings, options: RunOptions) -> RunSettings:
    """What a new run records about how it searches."""
    return _checked(
        RunSettings,
        {
            "strategy": options.strategy or RunSettings().strategy,
            "tree": _tree(TreeSettings(), options.tree),
            "pipeline": PipelineSettings(build_parallel=max(1, settings.build.max_parallel)),
            "budget": options.budget,
            "proposer": options.proposer or DEFAULT_PROPOSER,
            "app": settings.model_dump(mode="json"),
        },
    )


def _resumed_settings(recorded: RunSettings, options: RunOptions) -> RunSettings:
    updates: dict[str, object] = {
        "budget": recorded.budget.merged(options.budget),
        "tree": _tree(recorded.tree, options.tree),
        "proposer": options.proposer or recorded.proposer or DEFAULT_PROPOSER,
    }
    if options.strategy:
        updates["strategy"] = options.strategy
    return _checked(RunSettings, recorded.model_dump() | updates)


def _tree(base: TreeSettings, overrides: dict[str, str]) -> TreeSettings:
    unknown = sorted(set(overrides) - set(TreeSettings.model_fields))
    if unknown:
        fields = ", ".join(sorted(TreeSettings.model_fields))
        raise BadInput(f"--tree {unknown[0]}: use KEY=VALUE with KEY one of {fields}")
    return _checked(TreeSettings, base.model_dump() | overrides)


def _checked(model: type[M], data: dict[str, object]) -> M:
    """`data` as `model`; BadInput naming the first field that does not fit."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise BadInput(f"{where}: {first['msg']}") from None


def _same_backend(info: RunInfo, simulate: bool) -> None:
    """One run never mixes simulated and measured timings."""
    simulated = info.backend == SIMULATED
    if simulated != simulate:
        raise BadInput(
            f"run {info.run_id} was {'simulated' if simulated else 'measured on a GPU'}: "
            f"resume it {'with' if simulated else 'without'} --simulate (one run never mixes both)"
        )


def make_proposer(
    spec: str, llm: LlmSettings, family: str, root: Path | None = None
) -> tuple[Proposer, LlmClient | None]:
    """The proposer a run names, and the LLM client its agents ask through (None without agents).

    `agents` and `hybrid` need `[llm]` configured; their pooled coders are ranked by past success on `family` in
    the runs under `root` (`engine.router`)."""
    if spec not in LLM_PROPOSERS:
        return load_proposer(spec), None
    if not llm.configured:
        raise BadInput(
            f"--proposer {spec} needs an LLM: configure [[llm.providers]] and [[llm.models]] in "
            f"{config_file()} (README: LLM providers), or use --proposer templates"
        )
    from kernelforge_tui.proposers.agents import AgentProposer
    from kernelforge_tui.proposers.hybrid import HybridProposer
    from kernelforge_tui.proposers.templates import TemplateProposer

    client = LlmClient(llm)
    agents = AgentProposer(client, llm, rank_coders(llm, past_records(family, root)))
    if spec == "hybrid":
        return HybridProposer(TemplateProposer(), agents), client
    return agents, client


def load_proposer(spec: str) -> Proposer:
    """`templates` (the built-in library) or `module:Class` (any class following the Proposer protocol)."""
    if spec == DEFAULT_PROPOSER:
        from kernelforge_tui.proposers.templates import TemplateProposer

        return TemplateProposer()
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise BadInput(f"--proposer {spec!r}: give 'templates', 'agents', 'hybrid' or 'module:Class'")
    try:
        proposer = getattr(importlib.import_module(module_name), attr)()
    except (ImportError, AttributeError) as exc:
        raise BadInput(f"--proposer {spec!r} cannot be loaded: {exc}") from None
    if not isinstance(proposer, Proposer):
        raise BadInput(f"--proposer {spec!r} does not follow the Proposer protocol (name, propose, seeds)")
    return proposer


def make_backend(
    card: Card, settings: Settings, options: RunOptions, resumed: bool = False, cluster: Cluster | None = None
) -> SimulatedBackend | GpuBackend | ClusterBackend:
    """The simulation (real builds, invented timings), the visible GPUs, or a Dask cluster's (`cluster`, shared by a
    bench's searches, else the address of the options or settings); NoGpuError when there is no GPU here (for a
    resumed run measured on a GPU, the message says it continues only where a GPU is)."""
    address = options.cluster or settings.cluster.address
    if cluster is not None or address is not None:
        simulation = Simulation(eval_seconds=options.simulate_seconds) if options.simulate else None
        shared = cluster is not None
        cluster = cluster or Cluster(str(address), settings)
        return ClusterBackend(
            card, settings, cluster, simulation=simulation, owns_cluster=not shared, max_lanes=options.max_gpus
        )
    if options.simulate:
        return SimulatedBackend(card, make_builder(settings), eval_seconds=options.simulate_seconds)
    try:
        gpus = require_gpu()
    except NoGpuError as exc:
        if resumed:
            raise NoGpuError(
                f"{exc}: this run was measured on a GPU and continues only where one is (one run never mixes "
                "simulated and measured timings); `kernelforge open RUN` views it here"
            ) from None
        raise NoGpuError(f"{exc} (or pass --simulate to try the search with invented timings)") from None
    if options.gpus is not None:
        missing = sorted(set(options.gpus) - {gpu.index for gpu in gpus})
        if missing:
            found = ", ".join(str(gpu.index) for gpu in gpus)
            raise NoGpuError(f"no GPU with index {missing[0]} here (nvidia-smi lists {found})")
        gpus = [gpu for gpu in gpus if gpu.index in options.gpus]
    return GpuBackend(card, settings, gpus[: options.max_gpus])
