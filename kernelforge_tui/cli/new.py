"""`kernelforge new`: a card from a natural-language spec, a Python/NumPy reference and example sizes.

The card itself comes from `cards.from_spec` (reference copied and wrapped, shapes found by running it, input sets drawn
and referenced). This face adds the baseline kernel: the one given with --baseline/--plan, or, with an LLM
configured, a simple one the first coder model writes (`proposers/prompts/baseline.v1.md`). Either is really built
with nvcc before the card is written; the model gets one repair request with the compiler's errors (or with what was
wrong with its reply). Nothing is written unless everything worked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards.expr import ExprError
from kernelforge_tui.cards.from_spec import (
    CardDraft,
    CardRequest,
    SpecError,
    check_dtype,
    check_family,
    check_name,
    drafting,
    parse_reference,
    parse_sizes,
    parse_tensor,
)
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.cards.plan import plan_for_kernel, resolve
from kernelforge_tui.cli.evaluate import kernel_source
from kernelforge_tui.cli.output import EXIT_OK
from kernelforge_tui.config import Settings, config_file, load_settings
from kernelforge_tui.engine.backend import make_builder
from kernelforge_tui.errors import CheckFailed
from kernelforge_tui.gpu.evaluate import build_error
from kernelforge_tui.llm import ChatMessage, LlmClient, Malformed
from kernelforge_tui.proposers import prompting
from kernelforge_tui.proposers.agents import kernel_rules
from kernelforge_tui.proposers.replies import REPLY_FORMAT, parse_kernel
from kernelforge_tui.proposers.sections import card_text
from kernelforge_tui.vocabulary.evaluation import BuildResult
from kernelforge_tui.vocabulary.llm import LlmCall, usd

BASELINE_PROMPT = "baseline.v1"
REPAIR_PROMPT = "baseline_repair.v1"
"""The follow-up when the kernel does not compile; `reformat` (the agents') when the reply cannot be used."""
COMPILER_LOG_CHARS = 4000
"""How much of nvcc's log goes back to the model in the repair request (the first errors are the cause)."""


@dataclass
class Baseline:
    """The card's baseline kernel, where it came from, and what writing it cost."""

    source: str
    plan: LaunchPlan
    build: BuildResult
    author: str
    """"given", or the coder model's config name."""
    calls: list[LlmCall] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        ptxas = self.build.ptxas.get(self.plan.entry)
        return {
            "author": self.author,
            "entry": self.plan.entry,
            "registers": ptxas.registers if ptxas is not None else None,
            "llm_calls": len(self.calls),
            "input_tokens": sum(c.input_tokens for c in self.calls),
            "output_tokens": sum(c.output_tokens for c in self.calls),
            "cost_usd": usd(sum(c.cost_nanousd for c in self.calls)),
        }


def request_from(args: argparse.Namespace) -> CardRequest:
    """The options as a CardRequest; SpecError names the option and the fix."""
    reference, function = parse_reference(args.reference)
    return CardRequest(
        name=check_name(args.name),
        spec=args.spec.strip(),
        reference=reference,
        function=function,
        sizes=parse_sizes(args.sizes),
        dtype=check_dtype(args.dtype),
        family=check_family(args.family),
        inputs=tuple(parse_tensor(text, "--input") for text in args.input or []),
        outputs=tuple(parse_tensor(text, "--output") for text in args.output or []),
        sets=args.sets,
        flops=int(args.flops) if args.flops.strip().isdigit() else args.flops.strip(),
    )


async def built(builder: Builder, spec: OperatorCard, source: str, plan: LaunchPlan) -> BuildResult:
    """The kernel really built with nvcc for the card (its plan's arguments checked against the entry's parameters);
    a plan that does not fit the card is bad input."""
    try:
        launch = resolve(plan, spec)
    except ExprError as exc:
        raise SpecError("--plan", None, f"the launch plan does not fit the card: {exc}", "fix the plan") from None
    return await builder.build(source, plan.entry, launch.args)


def _nvcc_missing(result: BuildResult) -> None:
    if result.failure == "nvcc missing":
        raise CheckFailed(f"the baseline cannot be checked: {result.log}")


async def given_baseline(args: argparse.Namespace, builder: Builder, spec: OperatorCard) -> Baseline:
    kernel = Path(args.baseline)
    plan = plan_for_kernel(kernel, Path(args.plan) if args.plan else None)
    source = kernel_source(kernel)
    result = await built(builder, spec, source, plan)
    _nvcc_missing(result)
    if not result.ok:
        raise CheckFailed(f"{kernel}: the baseline does not compile: {build_error(result)}. Fix: correct the kernel")
    return Baseline(source, plan, result, "given")


async def written_baseline(settings: Settings, builder: Builder, draft: CardDraft, console: Console) -> Baseline:
    """The first coder model writes the baseline; one repair request when its reply cannot be used or does not
    compile. CheckFailed when the second answer fails too; LlmError when the provider fails."""
    llm = settings.llm
    model = llm.roles.coder[0]
    request = draft.request
    messages = prompting.load(BASELINE_PROMPT).messages(
        card=card_text(draft.spec),
        file=request.reference.name,
        function=request.function,
        reference=draft.reference_source.rstrip(),
        **kernel_rules(),
    )
    calls: list[LlmCall] = []
    problem = ""
    async with LlmClient(llm) as client:
        for attempt in (1, 2):
            console.print(f"[dim]asking {escape(model)} for a baseline kernel (attempt {attempt} of 2)[/]")
            try:
                answer = await client.ask("coder", model, messages, str)
            except Malformed as bad:  # cut off at max_tokens: a repair cannot help
                fix = f"raise max_tokens for {model} under [[llm.models]]"
                raise CheckFailed(f"{model} wrote no usable baseline: {bad}. Fix: {fix}") from None
            calls.append(answer.call)
            try:
                kernel = parse_kernel(answer.text, draft.spec)
            except Malformed as bad:
                problem = f"its reply could not be used: {bad}"
                repair = prompting.load("reformat").text(problem=str(bad), reply_format=REPLY_FORMAT)
            else:
                result = await built(builder, draft.spec, kernel.source, kernel.plan)
                _nvcc_missing(result)
                if result.ok:
                    return Baseline(kernel.source, kernel.plan, result, model, calls)
                problem = f"its kernel does not compile: {build_error(result)}"
                log = result.log.strip()[:COMPILER_LOG_CHARS]
                repair = prompting.load(REPAIR_PROMPT).text(log=log, reply_format=REPLY_FORMAT)
            messages = [
                *messages,
                ChatMessage(role="assistant", content=answer.text),
                ChatMessage(role="user", content=repair),
            ]
    raise CheckFailed(
        f"{model} wrote no baseline that compiles, after one repair request: {problem}. Fix: pass --baseline "
        "KERNEL.cu --plan PLAN.toml, or make another model the first coder ([llm.roles] coder)"
    )


async def _baseline(args: argparse.Namespace, settings: Settings, draft: CardDraft, console: Console) -> Baseline:
    builder = make_builder(settings)
    if args.baseline:
        return await given_baseline(args, builder, draft.spec)
    return await written_baseline(settings, builder, draft, console)


def cmd_new(args: argparse.Namespace, console: Console) -> int:
    request = request_from(args)
    if args.plan and not args.baseline:
        raise SpecError("--plan", None, "a plan without --baseline", "pass --baseline KERNEL.cu with it")
    settings = load_settings()
    if not args.baseline and not settings.llm.configured:
        raise SpecError(
            "--baseline",
            None,
            "no baseline kernel given and no LLM configured to write one",
            "pass --baseline KERNEL.cu --plan PLAN.toml (a simple, correct kernel and its launch plan), or configure "
            f"a model under [[llm.models]] in {config_file()} (README: LLM providers)",
        )
    quiet = Console(quiet=True) if args.json else console
    with drafting(request, Path(args.out) if args.out else None) as draft:
        baseline = asyncio.run(_baseline(args, settings, draft, quiet))
        card = draft.finish(baseline.source, baseline.plan)
    spec = card.spec
    stored = [s.name for s in spec.input_sets if s.file is not None]
    seeded = [s.name for s in spec.input_sets if s.seed is not None]
    if args.json:
        reply = {
            "ok": True,
            "card_dir": str(card.root),
            "name": spec.name,
            "family": spec.family,
            "reference": spec.reference.function,
            "inputs": {t.name: {"dtype": t.dtype, "shape": t.shape} for t in spec.inputs},
            "outputs": {t.name: {"dtype": t.dtype, "shape": t.shape} for t in spec.outputs},
            "stored_sets": stored,
            "seeded_sets": seeded,
            "cost": {"flops": spec.cost.flops, "bytes": spec.cost.bytes},
            "baseline": baseline.summary(),
        }
        print(json.dumps(reply, indent=2))
        return EXIT_OK

    console.print(f"[green bold]card {escape(spec.name)}[/] written to {escape(str(card.root))}")
    console.print(f"  inputs:  {escape(', '.join(_tensor(t.name, t.dtype, t.shape) for t in spec.inputs))}")
    console.print(f"  outputs: {escape(', '.join(_tensor(t.name, t.dtype, t.shape) for t in spec.outputs))}")
    console.print(f"  reference: {escape(str(spec.reference.function))}")
    console.print(
        f"  input sets: {len(stored)} stored (.npz), {len(seeded)} drawn from seeds"
        + ("" if stored else " (the sets are too large to store)")
    )
    console.print(f"  cost: flops = {escape(str(spec.cost.flops))}, bytes = {escape(str(spec.cost.bytes))}")
    summary = baseline.summary()
    if baseline.author == "given":
        console.print(f"  baseline: {escape(args.baseline)} (entry {baseline.plan.entry}), compiles")
    else:
        console.print(
            f"  baseline: written by {escape(baseline.author)} (entry {baseline.plan.entry}), compiles; "
            f"{summary['llm_calls']} call(s), {summary['input_tokens']} tokens in, {summary['output_tokens']} out, "
            f"${summary['cost_usd']:.4f}. Read it before you trust it: {escape(str(card.root / 'baseline.cu'))}"
        )
    console.print(f"next: kernelforge optimize {escape(str(card.root))}")
    return EXIT_OK


def _tensor(name: str, dtype: str, shape: list[str | int]) -> str:
    return f"{name} {dtype}[{', '.join(map(str, shape))}]"
