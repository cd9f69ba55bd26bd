"""`kernelforge export`, `verify` and `run`: make a .cast package from a run or a capture, check it on this GPU and
stamp it, and run a Python script with it loaded."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelforge_tui.cast.manifest import NOT_CHECKED, UNCHECKED_HELP, CastError, CastManifest, kernel_line
from kernelforge_tui.cli.output import EXIT_FAILED, EXIT_OK
from kernelforge_tui.errors import BadInput
from kernelforge_tui.store import StoreError, resolve_run


def add_cast_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    exp = sub.add_parser(
        "export",
        help="package a run's (or a capture's) proven kernels as a guarded .cast file, checked on this GPU",
        description="Package the proven kernels of a run, or of every variant of a capture, as a .cast file: per "
        "kernel its cubin and PTX, launch, guard, latency against eager and the card's baseline, and provenance; "
        "an audit line for every variant. Each kernel is checked on this GPU first (agreement and timing against "
        "eager PyTorch, compute-sanitizer memcheck, racecheck, initcheck); one that fails is left out.",
    )
    exp.add_argument("target", help="a run (directory or id) or a capture directory")
    exp.add_argument("-o", "--output", required=True, metavar="FILE.cast", help="the package to write")
    exp.add_argument(
        "--no-sanitize",
        action="store_true",
        help=f"no GPU checks (for a machine without a GPU): the package is written {NOT_CHECKED}, and the loader "
        "refuses it until `kernelforge verify` passes on a GPU",
    )
    exp.add_argument(
        "--runs", action="append", type=Path, metavar="DIR", help="where a capture's runs are (repeatable)"
    )
    exp.add_argument("--arch", help="target architecture such as sm_90 (default: this GPU's; with --no-sanitize only)")
    exp.add_argument("--root", metavar="DIR", help="runs root for a run given by id")
    exp.add_argument("--json", action="store_true", help="machine-readable output")
    ver = sub.add_parser(
        "verify",
        help="check every kernel of a .cast package on this GPU again and re-stamp it for this machine",
    )
    ver.add_argument("package", type=Path, help="the .cast file")
    ver.add_argument("-o", "--output", type=Path, metavar="FILE.cast", help="write here (default: in place)")
    ver.add_argument("--json", action="store_true", help="machine-readable output")
    run = sub.add_parser(
        "run",
        help="run a Python script with a .cast package loaded (its model unchanged)",
        description="Run SCRIPT (as `python SCRIPT ARGS...`) with the package's kernels in place of the aten calls "
        'they were proven for, in eager calls and in the script\'s torch.compile(model, backend="kernelforge"); '
        "prints, per kernel, its hits, fallbacks and where it was used at the end. KERNELFORGE_CAST=off runs it "
        "plain.",
    )
    run.add_argument("package", type=Path, help="the .cast file")
    run.add_argument("script", type=Path, help="the Python script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    run.add_argument("--shadow", type=int, metavar="N", help="compare one call in N with eager (0: off)")
    run.add_argument("--quiet", action="store_true", help="no report at the end")


def _progress(console: Console, as_json: bool) -> Callable[[str], None]:
    def say(text: str) -> None:
        if not as_json:
            console.print(f"[dim]{escape(text)}[/]")

    return say


def _show(console: Console, manifest: CastManifest, path: Path, as_json: bool, written: bool = True) -> None:
    """The package's audit, kernels and stamp; `written` False: export or verify kept no kernel and wrote no file."""
    if as_json:
        summary = {
            "ok": True,
            "package": str(path) if written else None,
            "verified": manifest.stamp is not None,
            "machine": manifest.stamp.machine.model_dump(mode="json") if manifest.stamp else None,
            "kernels": [
                {
                    **json.loads(k.model_dump_json(include={"id", "variant", "latency", "checks", "per_forward"})),
                    "serves": k.serves,
                    "saved_per_call_us": k.saved_per_call_us,
                    "saved_per_forward_us": k.saved_per_forward_us,
                }
                for k in manifest.kernels
            ],
            "audit": [json.loads(a.model_dump_json()) for a in manifest.audit],
            "notes": manifest.notes,
        }
        print(json.dumps(summary, indent=1))
        return
    title = f"{path}: {len(manifest.kernels)} kernel(s)" if written else f"no kernel passed: {path} not written"
    table = Table(title=title)
    for column in ("variant", "decision", "kernel / why"):
        table.add_column(column)
    shown = [a for a in manifest.audit if a.card is not None or a.decision == "kernel"]
    for entry in shown:
        colour = "green" if entry.decision == "kernel" else "yellow"
        what = entry.kernel or ""
        table.add_row(escape(entry.variant), f"[{colour}]{entry.decision}[/]", escape(f"{what} {entry.reason}".strip()))
    console.print(table)
    hidden = len(manifest.audit) - len(shown)
    if hidden:
        console.print(
            f"[dim]{hidden} more variant(s) without a card (views, matrix products, copies, ...) run the "
            "original operators: --json lists them with why[/]"
        )
    for kernel in manifest.kernels:
        console.print(escape(kernel_line(manifest, kernel)))
    if not written:
        console.print("[yellow bold]nothing written[/]: the audit above says why each variant falls back")
    elif manifest.stamp is not None:
        console.print(f"verified on {escape(manifest.stamp.machine.describe())} by {manifest.stamp.by}")
    else:
        console.print(f"[yellow bold]{NOT_CHECKED.upper()}[/]: {escape(UNCHECKED_HELP.format(path=path))}")
    for note in manifest.notes:
        console.print(f"[dim]note: {escape(note)}[/]")


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    from kernelforge_tui.cast.export import export

    target = Path(args.target)
    if not (target / "capture.json").is_file():
        try:
            target = resolve_run(args.target, Path(args.root) if args.root else None)
        except StoreError as exc:
            raise BadInput(
                f"{exc}; a capture directory holds capture.json (`kernelforge capture` writes one)"
            ) from None
    if args.arch and not args.no_sanitize:
        raise BadInput("--arch only goes with --no-sanitize: the checks build for this GPU")
    output = Path(args.output)
    try:
        manifest = export(
            target,
            output,
            runs=args.runs or (),
            arch=args.arch,
            sanitize=not args.no_sanitize,
            progress=_progress(console, args.json),
        )
    except CastError as exc:
        raise BadInput(str(exc)) from None
    _show(console, manifest, output, args.json, written=bool(manifest.kernels))
    return EXIT_OK if manifest.kernels else EXIT_FAILED


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from kernelforge_tui.cast.verify import verify

    try:
        manifest = verify(args.package, args.output, progress=_progress(console, args.json))
    except CastError as exc:
        raise BadInput(str(exc)) from None
    _show(console, manifest, args.output or args.package, args.json, written=bool(manifest.kernels))
    if not manifest.kernels and not args.json:
        console.print(f"{escape(str(args.package))} is left as it was: no kernel passed the checks on this machine")
    return EXIT_OK if manifest.kernels else EXIT_FAILED


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    script: Path = args.script
    if not script.is_file():
        raise BadInput(f"{script}: no such script")
    try:
        from kernelforge_tui.cast.runtime import load
    except ImportError as exc:
        raise BadInput(f"running a package needs torch ({exc}): pip install torch") from None
    try:
        cast = load(args.package, shadow_every=args.shadow)
    except CastError as exc:
        raise BadInput(str(exc)) from None
    from kernelforge_tui.cast.compiled import register

    register()  # the script's torch.compile(model, backend="kernelforge") takes this package
    saved = sys.argv
    sys.argv = [str(script), *args.args]
    code = 0
    try:
        with cast:
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
        if not args.quiet:
            cast.print_report()
    return code


CAST_COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "export": cmd_export,
    "verify": cmd_verify,
    "run": cmd_run,
}
