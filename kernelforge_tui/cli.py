"""kernelforge: search for faster CUDA kernels, proven correct and timed honestly.

Commands: doctor, eval, optimize, runs, tui, open, profile. Exit codes: 0 success, 1 the candidate (or a
check) failed, 2 bad input (card, plan, file, run), 3 no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.cards import load_card, plan_for_kernel, stress
from kernelforge_tui.cards.model import LaunchPlan
from kernelforge_tui.cards.store import Card
from kernelforge_tui.config import ConfigError, Settings, config_file, load_settings
from kernelforge_tui.engine.backend import SIMULATED, make_builder
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.search import Search
from kernelforge_tui.engine.setup import RunOptions, prepare_run, recorded_run
from kernelforge_tui.engine.strategies import STRATEGIES
from kernelforge_tui.engine.tree import TreeSettings
from kernelforge_tui.engine.view import RunView
from kernelforge_tui.errors import BadInput, KernelForgeError, NoGpu, not_utf8
from kernelforge_tui.gpu.build import find_nvcc, nvcc_version
from kernelforge_tui.gpu.detect import detect_gpus, pycuda_problem, require_gpu
from kernelforge_tui.gpu.evaluate import Evaluator
from kernelforge_tui.gpu.profile import ProfileError
from kernelforge_tui.gpu.profiling import ProfilingService, build_for_profile
from kernelforge_tui.gpu.sandbox import sandbox_status
from kernelforge_tui.models.commands import Stop
from kernelforge_tui.models.evaluation import Evaluation, speedup_text
from kernelforge_tui.models.events import EngineEvent
from kernelforge_tui.models.profiles import NodeProfile
from kernelforge_tui.models.runs import RunInfo
from kernelforge_tui.store import RunStore, list_runs, runs_root

EXIT_OK, EXIT_FAILED = 0, 1


class Check(BaseModel):
    """One line of `kernelforge doctor`."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def doctor_checks() -> list[Check]:
    """What this machine has for each stage, and the fix for what it lacks."""
    checks: list[Check] = []

    def add(name: str, ok: bool, detail: str, fix: str = "") -> None:
        checks.append(Check(name=name, ok=ok, detail=detail, fix="" if ok else fix))

    add("python", sys.version_info >= (3, 11), platform.python_version(), "use Python 3.11 or newer")
    settings: Settings | None = None
    try:
        settings = load_settings()
        add("config", True, str(config_file()) if config_file().is_file() else "no config file: defaults")
    except ConfigError as exc:
        add("config", False, exc.what(), exc.fix)
    nvcc = find_nvcc(settings.build.nvcc if settings else None)
    if nvcc is None:
        add("nvcc", False, "not found", "install the CUDA toolkit, or set KERNELFORGE_BUILD__NVCC to nvcc's path")
    else:
        try:
            add("nvcc", True, f"{nvcc_version(nvcc)} ({nvcc})")
        except (OSError, ValueError) as exc:
            add("nvcc", False, str(exc), "repair the CUDA toolkit installation")
    sandbox = sandbox_status()
    add("compiler sandbox", sandbox.mode != "limits", sandbox.description,
        "install bubblewrap (apt install bubblewrap) or allow unprivileged user namespaces, so nvcc cannot read "
        "host files")  # fmt: skip
    gpus = detect_gpus()
    for gpu in gpus:
        add(f"gpu {gpu.index}", True, f"{gpu.name}, compute capability {gpu.capability}, {gpu.memory_mib} MiB")
    if gpus:
        add("driver", True, gpus[0].driver)
    else:
        add("gpu", False, "no NVIDIA GPU found (nvidia-smi is missing or lists none)",
            "evaluate on a machine with an NVIDIA GPU and its driver; cards and builds work without one")  # fmt: skip
    problem = pycuda_problem()
    add("pycuda", problem is None, _version("pycuda") if problem is None else "not installed",
        "pip install 'kernelforge-tui[gpu]'")  # fmt: skip
    ncu = shutil.which("ncu")
    add("ncu", ncu is not None, ncu or "not found", "install Nsight Compute (in the CUDA toolkit) for profiling")
    torch = importlib.util.find_spec("torch") is not None
    add("torch", torch, _version("torch") if torch else "not installed",
        "pip install 'kernelforge-tui[torch]' to capture PyTorch models")  # fmt: skip
    return checks


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    checks = doctor_checks()
    if args.json:
        print(json.dumps([c.model_dump() for c in checks], indent=2))
    else:
        table = Table(title="kernelforge doctor", show_lines=False)
        for column in ("part", "", "found", "fix"):
            table.add_column(column)
        for c in checks:
            table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]missing[/]", escape(c.detail), escape(c.fix))
        console.print(table)
    essential = {"python", "config", "nvcc"}
    return EXIT_OK if all(c.ok for c in checks if c.name in essential) else EXIT_FAILED


def _kernel_source(path: Path) -> str:
    """A kernel file given on the command line; BadInput when it cannot be read as text."""
    try:
        return path.read_text()
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: {not_utf8(exc)}: save it as UTF-8") from None
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror or exc}: give a CUDA source file") from None


async def _evaluate(card: Card, kernel: Path, plan_path: Path | None) -> Evaluation:
    settings = load_settings()
    plan = plan_for_kernel(kernel, plan_path)
    source = _kernel_source(kernel)
    gpu = require_gpu()[0]
    evaluator = Evaluator(card, make_builder(settings, gpu.arch), settings, gpu)
    try:
        await evaluator.start()
        return await evaluator.evaluate(source, plan)
    finally:
        await evaluator.close()


def render_evaluation(
    evaluation: Evaluation, console: Console, copy_gbps: float | None = None, skipped: Sequence[stress.Planned] = ()
) -> None:
    """The human view of one verdict: a row per input set, the stress sets the card skips (a skipped set proves
    nothing, so its reason is shown beside the sets that ran), then timing against the baseline."""
    result = evaluation.result
    if evaluation.build is not None:
        build = evaluation.build
        stats = ", ".join(
            f"{k}: {v.registers} regs, {v.shared_bytes} B smem, {v.spill_store_bytes} B spills"
            for k, v in build.ptxas.items()
        )
        console.print(f"build: {'cached' if build.cached else f'{build.seconds:.2f} s'}  {stats}")
    if result is not None and result.checks:
        table = Table(title="correctness")
        for column in ("input set", "", "worst error / tolerance", "bad", "never written"):
            table.add_column(column)
        for check in result.checks:
            table.add_row(
                check.name,
                "[green]pass[/]" if check.ok else "[red]FAIL[/]",
                f"{check.max_error_ratio:.3g}",
                str(check.bad),
                str(check.unwritten),
            )
        console.print(table)
    for planned in skipped:
        console.print(f"[yellow]{escape(planned.describe())}[/]")
    if result is not None and result.candidate is not None:
        table = Table(title="timing (CUDA events, L2 flushed, interleaved with the baseline)")
        for column in ("kernel", "median", "p10-p90", "cv", "reps"):
            table.add_column(column)
        for name, t in (("candidate", result.candidate), ("baseline", result.baseline)):
            if t is not None:
                table.add_row(
                    name, f"{t.median_us:.2f} us", f"{t.p10_us:.2f}-{t.p90_us:.2f} us", f"{t.cv:.2%}", str(t.reps)
                )
        console.print(table)
        parts = []
        if result.speedup is not None:
            parts.append(f"speedup over the baseline: [bold]{speedup_text(result.speedup, result.speedup_interval)}[/]")
        if result.achieved_gbps is not None:
            parts.append(f"{result.achieved_gbps:.0f} GB/s")
        if evaluation.ceiling_share is not None:
            parts.append(f"{evaluation.ceiling_share:.0%} of the measured ceiling")
        console.print("  ".join(parts))
    if evaluation.ok:
        console.print(
            "[green bold]correct[/]" + ("" if result and result.deterministic else " (not bitwise deterministic)")
        )
    else:
        console.print(f"[red bold]{evaluation.failure}[/]: {escape(evaluation.reason)}")


def cmd_eval(args: argparse.Namespace, console: Console) -> int:
    card = load_card(Path(args.card))
    evaluation = asyncio.run(_evaluate(card, Path(args.kernel), Path(args.plan) if args.plan else None))
    skipped = [planned for planned in stress.plan(card.spec) if planned.skipped]
    if args.json:
        reply = json.loads(evaluation.model_dump_json())
        reply["skipped_stress_sets"] = {planned.label: planned.skipped for planned in skipped}
        print(json.dumps(reply, indent=2))
    else:
        render_evaluation(evaluation, console, skipped=skipped)
    return EXIT_OK if evaluation.ok else EXIT_FAILED


def _fail(console: Console, as_json: bool, kind: str, message: str, code: int) -> int:
    if as_json:
        print(json.dumps({"ok": False, "error": kind, "message": message}))
    else:
        console.print(f"[red bold]error:[/] {escape(message)}")
    return code


def _error_kind(exc: KernelForgeError) -> str:
    """The `error` field of a --json failure: what kind of problem, for scripts to branch on."""
    if isinstance(exc, ProfileError):
        return f"profile-{exc.kind}"
    if isinstance(exc, NoGpu):
        return "no-gpu"
    if isinstance(exc, BadInput):
        return "bad-input"
    return "failed"


# ---- optimize and runs ----------------------------------------------------------------------------


def render_run(info: RunInfo, live: RunView | None = None) -> Table:
    """The run at a glance: best speedup, share of the ceiling, nodes, failures, throughput, GPU use."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    simulated = info.backend == SIMULATED
    table.add_row("run", f"{escape(info.run_id)}  [dim]{escape(str(info.run_dir))}[/]")
    table.add_row("card", f"{escape(info.card_name)} ({info.family})")
    table.add_row("backend", "[yellow bold]SIMULATED: timings are invented, no GPU ran anything[/]" if simulated
                  else escape(info.gpu_name))  # fmt: skip
    table.add_row("state", f"{info.state}" + (f"  [dim]{escape(info.reason)}[/]" if info.reason else ""))
    if info.best_speedup is not None:
        label = "best (simulated)" if simulated else "best"
        best = speedup_text(info.best_speedup, info.best_speedup_interval, 3)
        table.add_row(label, f"[green bold]{best}[/] over the card's baseline, node "
                      f"{info.best_node_id}, {info.best_latency_us or 0:.4g} us")  # fmt: skip
        if info.best_ceiling_share is not None:
            ceiling = "the simulated ceiling" if simulated else "the measured ceiling"
            table.add_row("ceiling", f"{info.best_ceiling_share:.0%} of {ceiling}")
    table.add_row("nodes", f"{info.node_count} ({info.in_flight_count} in flight, {info.failure_count} failed)")
    budget = live.budget if live else None
    if budget is not None:
        caps = [f"{budget.iterations}" + (f"/{budget.max_iterations}" if budget.max_iterations is not None else "")
                + " candidates",
                f"{budget.elapsed_s / 60:.1f}" + (f"/{budget.max_seconds / 60:g}" if budget.max_seconds else "")
                + " min",
                f"{budget.gpu_seconds:.1f}" + (f"/{budget.max_gpu_seconds:g}" if budget.max_gpu_seconds else "")
                + " GPU s"]  # fmt: skip
        table.add_row("budget", ", ".join(caps))
        table.add_row("rate", f"{budget.candidates_per_minute:.1f} candidates/min, GPU busy "
                      f"{budget.gpu_busy_share:.0%}" + (" (simulated)" if simulated else ""))  # fmt: skip
    for line in live.recent_logs(4) if live is not None else ():
        node = f"#{line.node_id} " if line.node_id is not None else ""
        first = line.text.split("\n", 1)[0]  # a compiler error's first line; the TUI's log keeps the rest
        table.add_row("", f"[dim]{escape(node + first)}[/]")
    return table


def _tree_overrides(pairs: list[str]) -> dict[str, str]:
    """`--tree exploration=0.7` pairs; the run set-up checks them against TreeSettings."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            fields = ", ".join(sorted(TreeSettings.model_fields))
            raise BadInput(f"--tree {pair!r}: use KEY=VALUE with KEY one of {fields}")
        overrides[key] = value
    return overrides


async def _optimize(args: argparse.Namespace, console: Console) -> RunInfo:
    budget = Budget(
        max_iterations=args.budget_iters, max_minutes=args.budget_minutes, max_gpu_seconds=args.budget_gpu_seconds
    )
    options = RunOptions(
        resume=args.resume,
        run_dir=Path(args.run_dir) if args.run_dir else None,
        root=Path(args.root) if args.root else None,
        budget=budget,
        tree=_tree_overrides(args.tree or []),
        proposer=args.proposer,
        strategy=args.strategy,
        simulate=args.simulate,
        simulate_seconds=args.simulate_seconds,
    )
    search = prepare_run(Path(args.card) if args.card else None, load_settings(), options)
    try:
        return await _drive(search, console, quiet=args.json)
    finally:
        search.store.close()


async def _drive(search: Search, console: Console, quiet: bool) -> RunInfo:
    """Run the search under a live view; the first Ctrl-C (or SIGTERM) stops it cleanly, the second at once."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(search.run())
    signals = 0
    pending: set[asyncio.Task[None]] = set()

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            stop = loop.create_task(search.send(Stop()))
            pending.add(stop)
            stop.add_done_callback(pending.discard)
        else:
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    queue = search.subscribe()
    state = RunView()
    try:
        if quiet:
            return await task
        with Live(render_run(search.store.run_info(), state), console=console, refresh_per_second=4) as live:
            while not task.done():
                batch: list[EngineEvent] = []
                with contextlib.suppress(TimeoutError):
                    batch.append(await asyncio.wait_for(queue.get(), 0.25))
                while not queue.empty():
                    batch.append(queue.get_nowait())
                state.apply(batch)
                live.update(render_run(search.store.run_info(), state))
            info = await task
            live.update(render_run(info, state))
            return info
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def cmd_optimize(args: argparse.Namespace, console: Console) -> int:
    """A baseline that fails ends the command through BaselineFailed (exit code 1), like any typed error."""
    try:
        info = asyncio.run(_optimize(args, console))
    except asyncio.CancelledError:  # a second Ctrl-C: the run is left as it was, resumable
        return _fail(console, args.json, "interrupted", "interrupted: resume the run with --resume", EXIT_FAILED)
    if args.json:
        print(info.model_dump_json(indent=2))
    else:
        console.print()
        console.print(f"resume or extend it with: kernelforge optimize --resume {escape(str(info.run_dir))}")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, console: Console) -> int:
    listing = list_runs(Path(args.root) if args.root else None)
    for skipped in listing.skipped:  # on stderr: --json output stays a list of runs
        print(f"note: skipped {skipped.run_dir}: {skipped.reason}", file=sys.stderr)
    infos = listing.runs
    if args.json:
        print(json.dumps([i.model_dump(mode="json") for i in infos], indent=2))
        return EXIT_OK
    if not infos:
        console.print(f"no runs under {escape(str(Path(args.root) if args.root else runs_root()))}")
        return EXIT_OK
    table = Table(title="kernelforge runs")
    for column in ("run", "card", "backend", "state", "best", "ceiling", "nodes", "failed", "started"):
        table.add_column(column)
    for i in infos:
        best = f"{i.best_speedup:.3g}x (node {i.best_node_id})" if i.best_speedup is not None else "-"
        ceiling = f"{i.best_ceiling_share:.0%}" if i.best_ceiling_share is not None else "-"
        backend = "[yellow]simulated[/]" if i.backend == SIMULATED else escape(i.gpu_name)
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(i.started_at))
        table.add_row(
            escape(i.run_id),
            escape(i.card_name),
            backend,
            i.state,
            best,
            ceiling,
            str(i.node_count),
            str(i.failure_count),
            started,
        )
    console.print(table)
    return EXIT_OK


# ---- tui and open ---------------------------------------------------------------------------------


def cmd_tui(args: argparse.Namespace, console: Console) -> int:
    from kernelforge_tui.tui.launch import run_tui

    run_dir = run_tui(
        Path(args.card),
        theme=args.theme,
        budget_iters=args.budget_iters,
        budget_minutes=args.budget_minutes,
        simulate=args.simulate,
    )
    if run_dir:
        console.print(f"run stored in {escape(run_dir)}: `kernelforge open` it, or resume it with `optimize --resume`")
    return EXIT_OK


def cmd_open(args: argparse.Namespace, console: Console) -> int:
    from kernelforge_tui.tui.launch import open_run

    open_run(args.run, theme=args.theme)
    return EXIT_OK


# ---- profile ----------------------------------------------------------------------------------------


async def _profile_kernel(card_path: Path, kernel: Path, plan_path: Path | None) -> NodeProfile:
    """Build one kernel file and profile one launch of it on the card's first input set."""
    settings = load_settings()
    card = load_card(card_path)
    plan = plan_for_kernel(kernel, plan_path)
    return await _profile_source(card, _kernel_source(kernel), plan, settings, measured_us=None)


async def _profile_source(
    card: Card, source: str, plan: LaunchPlan, settings: Settings, measured_us: float | None
) -> NodeProfile:
    """Build and profile one kernel on the first GPU through the profiling service the search uses."""
    gpu = require_gpu()[0]
    kernel = await build_for_profile(card, make_builder(settings, gpu.arch), source, plan)
    return await ProfilingService.for_gpu(card, settings.profile, gpu).profile(kernel, measured_us)


def _profile_node(run: str, node_id: int, again: bool, save: bool) -> NodeProfile:
    """A run node's saved profile, or a fresh one (then saved on the node)."""
    recorded = recorded_run(run)
    with RunStore.open(recorded.run_dir, readonly=True) as store:
        saved = store.profile(node_id)
        source, plan = store.node_source(node_id)
        evaluation = store.evaluation(node_id)
    if saved is not None and not again:
        return saved
    measured = evaluation.result.candidate if evaluation and evaluation.result else None
    card = load_card(recorded.card_dir)
    profiled = asyncio.run(
        _profile_source(card, source, plan, load_settings(), measured.median_us if measured else None)
    )
    if save:
        with RunStore.open(recorded.run_dir) as store:
            store.save_profile(node_id, profiled)
    return profiled


def render_profile(profiled: NodeProfile, console: Console) -> None:
    """The classified report: class and why, the metrics that matter for it, stalls, roofline, overhead."""
    hw, report = profiled.hardware, profiled.profile
    console.print(f"[bold]{escape(hw.kernel)}[/]: [bold cyan]{hw.class_name}[/]  [dim]{escape(hw.reason)}[/]")
    table = Table(title=f"what matters for a {hw.class_name} kernel")
    for column in ("metric", "value", "note"):
        table.add_column(column)
    for metric in hw.key_metrics + hw.stalls:
        label = f"stall: {metric.label}" if metric in hw.stalls else metric.label
        table.add_row(escape(label), escape(metric.value_text()), escape(metric.note))
    console.print(table)
    if hw.roofline is not None:
        r = hw.roofline
        console.print(
            f"roofline: {r.arithmetic_intensity:.3g} FLOP/B (ridge {r.ridge_point:.3g}); {r.achieved_gbps:.0f} GB/s, "
            f"{r.achieved_tflops:.3g} TFLOP/s: [bold]{r.share_of_attainable:.0%}[/] of the {r.bound} roof "
            f"({r.time_source} time)"
        )
    else:
        console.print("[dim]roofline: no measured ceilings for this GPU yet (run `kernelforge eval` once)[/]")
    stats = profiled.ptxas
    if stats is not None:
        console.print(f"ptxas: {stats.registers} registers, {stats.shared_bytes} B static shared, "
                      f"{stats.spill_store_bytes + stats.spill_load_bytes} B spills")  # fmt: skip
    console.print(f"[dim]ncu {escape(report.ncu_version)}, {len(report.metrics)} metrics, "
                  f"profiled in {report.seconds:.1f} s[/]")  # fmt: skip
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def cmd_profile(args: argparse.Namespace, console: Console) -> int:
    if args.what.isdigit():
        profiled = _profile_node(args.target, int(args.what), args.again, not args.no_save)
    else:
        plan = Path(args.plan) if args.plan else None
        profiled = asyncio.run(_profile_kernel(Path(args.target), Path(args.what), plan))
    if args.json:
        print(profiled.model_dump_json(indent=2))
    else:
        render_profile(profiled, console)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelforge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="check Python, nvcc, the GPU and driver, pycuda and ncu")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    ev = sub.add_parser("eval", help="build, prove correct and time one kernel against a card's baseline")
    ev.add_argument("card", help="card directory (holding card.toml)")
    ev.add_argument("kernel", help="CUDA source of the candidate")
    ev.add_argument("--plan", help="launch plan TOML (default: KERNEL with .plan.toml)")
    ev.add_argument("--json", action="store_true", help="machine-readable output")
    opt = sub.add_parser("optimize", help="search for faster kernels for a card (tree search, live view)")
    opt.add_argument("card", nargs="?", help="card directory (holding card.toml); optional with --resume")
    opt.add_argument("--budget-iters", type=int, metavar="N", help="stop after N candidates evaluated")
    opt.add_argument("--budget-minutes", type=float, metavar="M", help="stop after M minutes of search")
    opt.add_argument("--budget-gpu-seconds", type=float, metavar="S", help="stop after S GPU seconds of evaluation")
    opt.add_argument("--resume", metavar="RUN", help="continue a run (its id or directory) after a stop or a crash")
    opt.add_argument("--run-dir", metavar="DIR", help="where the new run's store goes (default: under --root)")
    opt.add_argument("--root", metavar="DIR", help="runs root (default: the data dir's runs/)")
    opt.add_argument(
        "--simulate",
        action="store_true",
        help="no GPU: real nvcc builds, INVENTED timings (for trying the tool and for CI)",
    )
    opt.add_argument(
        "--simulate-seconds",
        type=float,
        default=0.01,
        metavar="S",
        help="simulated GPU seconds per evaluation (with --simulate)",
    )
    opt.add_argument("--proposer", metavar="NAME", help="'templates' (default) or module:Class")
    opt.add_argument("--strategy", choices=sorted(STRATEGIES), help="selection strategy (default: mcts)")
    opt.add_argument(
        "--tree",
        action="append",
        metavar="KEY=VALUE",
        help="tree search constant, e.g. --tree exploration=0.7 (see README)",
    )
    opt.add_argument("--json", action="store_true", help="no live view; print the run summary as JSON")
    runs = sub.add_parser("runs", help="list runs with their best results")
    runs.add_argument("--root", metavar="DIR", help="runs root (default: the data dir's runs/)")
    runs.add_argument("--json", action="store_true", help="machine-readable output")
    tui = sub.add_parser("tui", help="search a card under the terminal UI (watch and steer it live)")
    tui.add_argument("card", help="card directory (holding card.toml)")
    tui.add_argument("--theme", help="dark, light, high-contrast or ansi (default: the config's, else dark)")
    tui.add_argument("--budget-iters", type=int, metavar="N", help="stop after N candidates evaluated")
    tui.add_argument("--budget-minutes", type=float, metavar="M", help="stop after M minutes of search")
    tui.add_argument(
        "--simulate", action="store_true", help="no GPU: real nvcc builds, INVENTED timings (for trying the tool)"
    )
    opn = sub.add_parser("open", help="open a run in the terminal UI: a finished one, or one live in another process")
    opn.add_argument("run", help="run directory or run id")
    opn.add_argument("--theme", help="dark, light, high-contrast or ansi (default: the config's, else dark)")
    prof = sub.add_parser("profile", help="profile a run's node (or a kernel file) with Nsight Compute and classify it")
    prof.add_argument("target", help="a run (directory or id), or a card directory")
    prof.add_argument("what", help="the node id in the run, or a CUDA source file for the card")
    prof.add_argument("--plan", help="launch plan TOML for a kernel file (default: KERNEL with .plan.toml)")
    prof.add_argument("--again", action="store_true", help="profile a node again even where a profile is saved")
    prof.add_argument("--no-save", action="store_true", help="do not save a node's new profile in the run")
    prof.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "doctor": cmd_doctor,
    "eval": cmd_eval,
    "optimize": cmd_optimize,
    "runs": cmd_runs,
    "tui": cmd_tui,
    "open": cmd_open,
    "profile": cmd_profile,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Errors raised on purpose (`KernelForgeError`) become one line (or a JSON object with
    --json) and the exit code of their type; anything else is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    console = Console(stderr=False)
    try:
        return COMMANDS[args.command](args, console)
    except KernelForgeError as exc:
        return _fail(console, getattr(args, "json", False), _error_kind(exc), str(exc), exc.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
