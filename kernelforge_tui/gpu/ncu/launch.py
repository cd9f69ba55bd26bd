"""Launch one built kernel once, exactly as the GPU worker launches it, for Nsight Compute to profile.

Why a separate program: ncu profiles a whole process, and what it measures must be what the worker
timed. So this goes through `Worker`'s public launch API (its context, guarded buffers, argument packing
and `prepared_async_call` launch) on one input set of the card, poisons the outputs as a checked run
does, launches the candidate once and exits. Nothing else runs a kernel in this process, so
`ncu --kernel-name ENTRY --launch-count 1` catches exactly that launch.

Usage: python -m kernelforge_tui.gpu.ncu.launch CARD_DIR CUBIN (--launch JSON | --plan PLAN.toml)
Exit codes: 0 launched, 2 bad input, 3 the kernel faulted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kernelforge_tui.cards.directory import Card, load_card
from kernelforge_tui.cards.errors import CardError
from kernelforge_tui.cards.expr import ExprError
from kernelforge_tui.cards.model import InputSet
from kernelforge_tui.cards.plan import ResolvedLaunch, load_plan, resolve
from kernelforge_tui.gpu.protocol import KernelRef

EXIT_LAUNCHED, EXIT_USAGE, EXIT_FAULT = 0, 2, 3


def pick_set(card: Card, name: str | None) -> InputSet:
    """The named input set, else the card's first one."""
    sets = card.spec.input_sets
    if name is None:
        return sets[0]
    for which in sets:
        if which.name == name:
            return which
    raise CardError(card.manifest, "input_sets", f"no input set {name!r}", f"use one of {[s.name for s in sets]}")


def launch_once(card: Card, cubin: Path, launch: ResolvedLaunch, set_name: str | None = None) -> None:
    """Load one input set through the worker's own code and launch the kernel once on it."""
    from kernelforge_tui.gpu.worker import Worker

    which = pick_set(card, set_name)
    worker = Worker()
    try:
        worker.load_input_set(card, which)
        worker.launch_once(worker.load_kernel(KernelRef(cubin=cubin, launch=launch)))
    finally:
        worker.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelforge_tui.gpu.ncu.launch", description=__doc__)
    parser.add_argument("card", type=Path, help="card directory")
    parser.add_argument("cubin", type=Path, help="the built kernel")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--launch", help="ResolvedLaunch as JSON (what the worker launches)")
    how.add_argument("--plan", type=Path, help="launch plan TOML, resolved against the card")
    parser.add_argument("--set", dest="set_name", help="input set name (default: the card's first)")
    args = parser.parse_args(argv)
    # ncu shares this process's stdout with its own report: keep ours out of it.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        card = load_card(args.card)
        if args.launch is not None:
            launch = ResolvedLaunch.model_validate_json(args.launch)
        else:
            launch = resolve(load_plan(args.plan), card.spec)
        if not args.cubin.is_file():
            raise FileNotFoundError(f"no cubin at {args.cubin}")
    except (CardError, ExprError, FileNotFoundError, ValueError) as exc:
        print(f"ncu.launch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from kernelforge_tui.gpu.device import CandidateFault

    try:
        launch_once(card, args.cubin, launch, args.set_name)
    except CandidateFault as exc:
        print(f"ncu.launch: the kernel faulted: {exc}", file=sys.stderr)
        return EXIT_FAULT
    return EXIT_LAUNCHED


if __name__ == "__main__":
    raise SystemExit(main())
