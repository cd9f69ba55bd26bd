"""kernelforge: search for faster CUDA kernels, proven correct and timed honestly.

Commands: doctor, new, capture, eval, optimize, bench, runs, show, tui, open, profile, export, verify, run. Exit
codes: 0 success, 1 the candidate (or a check) failed, 2 bad input (card, plan, file, run), 3 no GPU, 141 the reader
of the output went away (`| head`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Callable, Sequence

from rich.console import Console

from kernelforge_tui.cards.from_spec import DTYPES, FAMILIES
from kernelforge_tui.cli.bench import add_bench_parser, cmd_bench
from kernelforge_tui.cli.capture import add_capture_parser, cmd_capture
from kernelforge_tui.cli.cast import CAST_COMMANDS, add_cast_parsers
from kernelforge_tui.cli.cluster_option import add_cluster_option
from kernelforge_tui.cli.doctor import cmd_doctor
from kernelforge_tui.cli.evaluate import cmd_eval
from kernelforge_tui.cli.new import cmd_new
from kernelforge_tui.cli.output import error_kind, fail, make_console, reader_gone, stdout_reader_gone
from kernelforge_tui.cli.profile import cmd_profile
from kernelforge_tui.cli.runs import cmd_open, cmd_optimize, cmd_runs, cmd_tui
from kernelforge_tui.cli.show import add_show_parser, cmd_show
from kernelforge_tui.engine.strategies import STRATEGIES
from kernelforge_tui.errors import KernelForgeError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelforge", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kernelforge {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser(
        "doctor", help="check Python, nvcc, the GPU and driver, pycuda, ncu, and each configured LLM model"
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument(
        "--cluster", metavar="ADDRESS", help="also check a Dask scheduler and its GPU workers ([cluster] address)"
    )
    _new_parser(sub)
    add_capture_parser(sub)
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
    _llm_budgets(opt)
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
    add_cluster_option(opt)
    opt.add_argument("--proposer", metavar="NAME", help=PROPOSER_HELP)
    opt.add_argument("--strategy", choices=sorted(STRATEGIES), help="selection strategy (default: mcts)")
    opt.add_argument(
        "--tree",
        action="append",
        metavar="KEY=VALUE",
        help="tree search constant, e.g. --tree exploration=0.7 (see README)",
    )
    opt.add_argument("--json", action="store_true", help="no live view; print the run summary as JSON")
    opt.add_argument("--top", type=int, metavar="N", help="with a capture directory: search its N best variants only")
    add_bench_parser(sub)
    runs = sub.add_parser("runs", help="list runs with their best results")
    runs.add_argument("--root", metavar="DIR", help="runs root (default: the data dir's runs/)")
    runs.add_argument(
        "--models",
        action="store_true",
        help="compare the LLM models per card across the runs: calls, kernels written, success rate, best, cost",
    )
    runs.add_argument("--json", action="store_true", help="machine-readable output")
    runs_sub = runs.add_subparsers(dest="runs_command", metavar="copy")
    copy = runs_sub.add_parser(
        "copy", help="copy a run (an example's, say) to a new directory, to steer or continue it there"
    )
    copy.add_argument("src", help="run directory or run id (under --root)")
    copy.add_argument("dest", help="the new run directory")
    tui = sub.add_parser("tui", help="search a card under the terminal UI (watch and steer it live)")
    tui.add_argument("card", help="card directory (holding card.toml)")
    tui.add_argument("--theme", help="dark, light, high-contrast or ansi (default: the config's, else dark)")
    tui.add_argument("--budget-iters", type=int, metavar="N", help="stop after N candidates evaluated")
    tui.add_argument("--budget-minutes", type=float, metavar="M", help="stop after M minutes of search")
    _llm_budgets(tui)
    tui.add_argument("--proposer", metavar="NAME", help=PROPOSER_HELP)
    add_cluster_option(tui)
    tui.add_argument(
        "--simulate", action="store_true", help="no GPU: real nvcc builds, INVENTED timings (for trying the tool)"
    )
    tui.add_argument(
        "--simulate-seconds",
        type=float,
        default=0.01,
        metavar="S",
        help="simulated GPU seconds per evaluation (with --simulate; e.g. 2 leaves time to try steering)",
    )
    opn = sub.add_parser("open", help="open a run in the terminal UI: a finished one, or one live in another process")
    opn.add_argument("run", help="run directory or run id")
    opn.add_argument("--theme", help="dark, light, high-contrast or ansi (default: the config's, else dark)")
    opn.add_argument(
        "--resume",
        action="store_true",
        help="continue a finished or interrupted run here, under the TUI (a simulated run goes on simulated; one "
        "measured on a GPU needs a GPU); budgets given replace the run's caps",
    )
    opn.add_argument("--budget-iters", type=int, metavar="N", help="with --resume: stop at N candidates in the run")
    opn.add_argument("--budget-minutes", type=float, metavar="M", help="with --resume: stop at M minutes in the run")
    opn.add_argument(
        "--budget-gpu-seconds", type=float, metavar="S", help="with --resume: stop at S GPU seconds in the run"
    )
    _llm_budgets(opn)
    opn.add_argument(
        "--simulate", action="store_true", help="with --resume: the run is simulated (it is continued so anyway)"
    )
    opn.add_argument(
        "--simulate-seconds", type=float, default=0.01, metavar="S", help="with --resume: simulated GPU seconds each"
    )
    add_cluster_option(opn, "with --resume: ")
    prof = sub.add_parser("profile", help="profile a run's node (or a kernel file) with Nsight Compute and classify it")
    prof.add_argument("target", help="a run (directory or id), or a card directory")
    prof.add_argument("what", help="the node id in the run, or a CUDA source file for the card")
    prof.add_argument("--plan", help="launch plan TOML for a kernel file (default: KERNEL with .plan.toml)")
    prof.add_argument("--again", action="store_true", help="profile a node again even where a profile is saved")
    prof.add_argument("--no-save", action="store_true", help="do not save a node's new profile in the run")
    prof.add_argument("--json", action="store_true", help="machine-readable output")
    add_show_parser(sub)
    add_cast_parsers(sub)
    return parser


PROPOSER_HELP = (
    "where candidates come from: 'templates' (the built-in library, the default, no LLM), 'agents' (the LLM team "
    "of [llm] in the config), 'hybrid' (templates and agents side by side, the tree deciding), or module:Class"
)


def _llm_budgets(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget-money", type=float, metavar="USD", help="stop once the run's LLM calls cost USD dollars"
    )
    parser.add_argument(
        "--budget-tokens", type=int, metavar="N", help="stop once the run's LLM calls used N tokens (in and out)"
    )


def _new_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    new = sub.add_parser(
        "new",
        help="make a card from a spec: a description, a Python/NumPy reference and example sizes",
        description="Make an operator card from a natural-language spec, a Python/NumPy reference and example "
        "sizes. The reference is copied into the card; shapes are found by running it; input sets are drawn and "
        "referenced; the baseline kernel is --baseline, or one the configured coder model writes (checked with nvcc).",
    )
    new.add_argument("name", help="the card's name (also its directory's, unless -o)")
    new.add_argument(
        "--spec", required=True, metavar="TEXT", help="what the operator computes, in words (agents read it)"
    )
    new.add_argument(
        "--reference",
        required=True,
        metavar="FILE.py:FUNCTION",
        help="the reference: FUNCTION(inputs, sizes) -> dict of outputs, or FUNCTION(x, ...) taking the inputs as "
        "keyword arguments named like the tensors (sizes too, by name) and returning arrays",
    )
    new.add_argument("--sizes", required=True, metavar="NAME=N,...", help="example sizes, e.g. rows=4096,cols=32768")
    new.add_argument("--dtype", required=True, metavar="DTYPE", help=f"tensor dtype: {', '.join(DTYPES)}")
    new.add_argument("-o", "--out", metavar="DIR", help="the card directory to create (default: ./NAME)")
    new.add_argument("--family", default="other", metavar="F", help=f"op family (stress sets): {', '.join(FAMILIES)}")
    new.add_argument(
        "--input",
        action="append",
        metavar="NAME[:DTYPE]=DIMS",
        help="an input tensor, e.g. x=rows,cols (default: the reference's parameters, each shaped by every size)",
    )
    new.add_argument(
        "--output",
        action="append",
        metavar="NAME[:DTYPE][=DIMS]",
        help="an output's name and shape, e.g. y=rows (default: found by running the reference)",
    )
    new.add_argument("--sets", type=int, default=2, metavar="N", help="input sets stored with the card (default 2)")
    new.add_argument("--flops", default="0", metavar="FORMULA", help="FLOPs as a formula over the sizes (default 0)")
    new.add_argument(
        "--baseline", metavar="KERNEL.cu", help="the baseline kernel (default: the coder model writes one)"
    )
    new.add_argument("--plan", metavar="PLAN.toml", help="the baseline's launch plan (default: KERNEL.plan.toml)")
    new.add_argument("--json", action="store_true", help="machine-readable output")


COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "doctor": cmd_doctor,
    "new": cmd_new,
    "capture": cmd_capture,
    "eval": cmd_eval,
    "optimize": cmd_optimize,
    "bench": cmd_bench,
    "runs": cmd_runs,
    "tui": cmd_tui,
    "open": cmd_open,
    "profile": cmd_profile,
    "show": cmd_show,
    **CAST_COMMANDS,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Errors raised on purpose (`KernelForgeError`) become one line (or a JSON object with
    --json) and the exit code of their type; anything else is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    console = make_console()
    try:
        try:
            code = COMMANDS[args.command](args, console)
        except KernelForgeError as exc:
            code = fail(console, getattr(args, "json", False), error_kind(exc), str(exc), exc.exit_code)
        sys.stdout.flush()  # a closed pipe shows here, not in Python's flush at exit
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        return reader_gone()  # `... | head` read what it wanted: no traceback
    return code


def version() -> str:
    """The installed distribution's version (a checkout installed with -e says its own)."""
    try:
        return importlib.metadata.version("kernelforge-tui")
    except importlib.metadata.PackageNotFoundError:
        from kernelforge_tui import __version__

        return __version__
