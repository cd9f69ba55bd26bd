"""The LLM agent team as a proposer: CUDAMaster's expert roles (analyst, planner, coder, debugger) with OptiML's
judge, and a pool of coder models that each write a first kernel for a new card.

Why roles and not one prompt: each role sees only what it needs (the analyst the metrics of the kernel's
bottleneck class, the coder the strategy and the kernel, the debugger the failure), so prompts stay small and each
reply is checked for what that role must give. The tree search decides which candidates pay off; the team only
proposes, and a failure costs one node, never the run: a provider error loses that candidate alone, a reply that
cannot be used gets one request to fix it and then becomes a failed node with the reply kept.

How an expansion goes: failed children the team wrote are repaired first (at most D rounds along the repair
links: a failed kernel by the debugger, an unusable reply by the coder again, told why), then new candidates fill
the rest: one diagnosis of the parent, one strategy per candidate planned in turn
(each planner call told what was already planned), then every candidate coded and judged at once; a strategy the
judge scores below `judge_accept` goes back to the planner with the critique while rounds (R) remain.
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.config import LlmSettings, ModelSettings
from kernelforge_tui.errors import BadInput
from kernelforge_tui.llm.client import Answer, LlmClient, Malformed, Truncated
from kernelforge_tui.llm.errors import LlmError
from kernelforge_tui.llm.types import ChatMessage
from kernelforge_tui.proposers.base import FailedSibling, Proposal, ProposalContext
from kernelforge_tui.proposers.prompting import Entry, Listing, fit, load
from kernelforge_tui.proposers.replies import REPLY_FORMAT, KernelReply, parse_kernel
from kernelforge_tui.proposers.role_replies import (
    TITLE_CHARS,
    Strategy,
    Verdict,
    parse_strategy,
    parse_text,
    parse_verdict,
)
from kernelforge_tui.proposers.sections import (
    REASON_CHARS,
    bullets,
    card_text,
    diagnostics_text,
    failures_listing,
    first_line,
    gpu_text,
    kernel_text,
    lineage_listing,
    operator_line,
    parent_speed,
    plan_json,
    profile_text,
    ptxas_text,
)
from kernelforge_tui.vocabulary.llm import LlmCall, Role
from kernelforge_tui.vocabulary.nodes import FailureKind

LOST = (LlmError, Malformed)
"""What loses one candidate, not the expansion: the provider failed, or a role's reply could not be used."""


@dataclass(frozen=True)
class Analysis:
    """What the planner and the judge are told about the parent's bottleneck, and the calls that wrote it."""

    text: str
    calls: tuple[int, ...] = ()


@dataclass
class Trail:
    """What writing one candidate left behind: the calls (linked to the node it becomes) and lines for the
    operator's log."""

    calls: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, call: LlmCall | None) -> None:
        if call is not None and call.id is not None:
            self.calls.append(call.id)


@dataclass(frozen=True)
class Rejection:
    """A kernel reply that could not be used even after the request to fix it."""

    reply: str
    problem: str


UNUSABLE = "the reply could not be used"
"""What a rejected reply's node says it did."""


def said(kernel: KernelReply | Rejection) -> str:
    """What the writer says it did (its reply's first line of prose), for the node's mutation text."""
    if isinstance(kernel, Rejection):
        return UNUSABLE
    return first_line(kernel.prose, TITLE_CHARS) or "no summary given"


def origin(failed: FailedSibling, siblings: Sequence[FailedSibling]) -> FailedSibling:
    """The failure an unusable reply was written for: back along the repair links past every unusable reply, to
    a kernel that failed (a debugger's reply) or to the first unusable reply (a coder's)."""
    by_id = {s.node_id: s for s in siblings}
    while failed.failure == FailureKind.MALFORMED and failed.repair_of in by_id:
        failed = by_id[failed.repair_of]
    return failed


def ids(*answers: Answer[Any]) -> tuple[int, ...]:
    return tuple(a.call.id for a in answers if a.call.id is not None)


async def settle(jobs: Sequence[Coroutine[Any, Any, list[Proposal]]]) -> list[Proposal]:
    """Run the jobs at once and keep what they proposed: a job lost to its provider or to an unusable reply loses
    only its own candidates. When every job was lost, the first error is raised so the engine logs it (and counts a
    provider failure). A bug in one job cancels the others; cancellation from outside goes through."""

    async def guard(job: Coroutine[Any, Any, list[Proposal]]) -> list[Proposal] | Exception:
        try:
            return await job
        except LOST as exc:
            return exc

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(guard(job)) for job in jobs]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from failed  # the bug itself, for the engine's one-line log
    results = [task.result() for task in tasks]
    proposals = [p for r in results if isinstance(r, list) for p in r]
    errors = [r for r in results if isinstance(r, Exception)]
    if errors and not proposals:
        raise errors[0]
    return proposals


class AgentProposer:
    """Candidates written by the configured models in their roles. `coder_order` is the router's ranking of the
    coder pool (default: the config's order): the first writes every kernel after the pooled first ones."""

    name = "agents"

    def __init__(self, client: LlmClient, settings: LlmSettings, coder_order: Sequence[str] | None = None) -> None:
        coders = list(coder_order if coder_order is not None else settings.roles.coder)
        known = {model.name for model in settings.models}
        unknown = [name for name in coders if name not in known]
        if not coders or unknown:
            raise BadInput(
                f"the agent team has no usable coder model (unknown: {unknown or 'none'}): name models from "
                "[[llm.models]] under [llm.roles] coder"
            )
        self.client = client
        self.settings = settings
        self.coders = coders
        self._analyses: dict[int, Analysis] = {}
        """Diagnoses by node: a parent expanded again is not analysed again."""

    @property
    def coder(self) -> str:
        return self.coders[0]

    def seeds(self, card: Card) -> list[Proposal]:
        """None: the pooled first kernels are written when the root is first expanded (each takes a model call)."""
        return []

    def read_hint(self, card: OperatorCard, text: str) -> str:
        """What becomes of a hint (for the search's log line): the team reads it as written, nothing is parsed."""
        return "kept as written: it goes into the planner's prompt (and a first kernel's) for this node and its subtree"

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        if n <= 0:
            return []
        if ctx.first_expansion:
            pool = self.coders[: min(self.settings.agents.pool_size, n)]
            return await settle([self._first_kernel(ctx, model) for model in pool])
        repairs = [failed for failed in ctx.failed_siblings if self._repairable(failed)][:n]
        jobs = [self._redo(ctx, failed) for failed in repairs]
        if n > len(repairs):
            jobs.append(self._new_candidates(ctx, n - len(repairs)))
        return await settle(jobs)

    # ---- the roles -------------------------------------------------------------------------------------------------

    async def _first_kernel(self, ctx: ProposalContext, model: str) -> list[Proposal]:
        fields = {
            **kernel_rules(),
            "card": card_text(ctx.card),
            "gpu": gpu_text(ctx.gpu, ctx.card),
            "baseline": kernel_text(ctx.parent.source, ctx.parent.plan),
            "hints": bullets(ctx.hints, "(none)"),
        }
        trail = Trail()
        messages = fit(load("first"), self.settings.agents.prompt_tokens, fields, {})
        kernel = await self._write(ctx.card, "coder", model, messages, ctx.parent.id, trail)
        mutation = f"first kernel by {model}: {said(kernel)}"
        return [self._proposal(kernel, model, mutation, ctx.parent.plan, trail)]

    def _repairable(self, failed: FailedSibling) -> bool:
        return (
            failed.proposer.startswith(self.name)
            and not failed.repaired
            and failed.repair_round < self.settings.agents.debug_rounds
        )

    def _redo(self, ctx: ProposalContext, failed: FailedSibling) -> Coroutine[Any, Any, list[Proposal]]:
        """A failed kernel goes to the debugger; an unusable reply back to the role that was writing: the coder
        (with why it could not be used), or the debugger again for the kernel it was repairing."""
        if failed.failure != FailureKind.MALFORMED:
            return self._repair(ctx, failed, failed)
        written_for = origin(failed, ctx.failed_siblings)
        if written_for.failure != FailureKind.MALFORMED:
            return self._repair(ctx, written_for, failed)
        return self._rewrite(ctx, written_for, failed)

    async def _repair(self, ctx: ProposalContext, failed: FailedSibling, link: FailedSibling) -> list[Proposal]:
        """The debugger's fix of `failed`, recorded as a repair of `link` (`failed` itself, or a debugger's
        unusable reply to it), whose round it continues."""
        model = self.settings.roles.debugger or self.coder
        plan = failed.plan or ctx.parent.plan
        round_ = link.repair_round + 1
        reason = failed.reason.strip()
        fields = {
            **kernel_rules(),
            "card": card_text(ctx.card),
            "gpu": gpu_text(ctx.gpu, ctx.card),
            "kernel": kernel_text(failed.source, plan, numbered=True),
            "diagnostics": diagnostics_text(failed.diagnostics),
            "mutation": failed.summary,
            "failure": str(failed.failure),
            "round": str(round_),
            "rounds": str(self.settings.agents.debug_rounds),
        }
        entries = [Entry(failed.node_id, reason, reason[:REASON_CHARS])] if reason else []
        why = Listing(entries, "", "(no reason recorded)", foldable=False)
        messages = fit(load("debugger"), self.settings.agents.prompt_tokens, fields, {"reason": why})
        trail = Trail()
        kernel = await self._write(ctx.card, "debugger", model, messages, failed.node_id, trail)
        mutation = f"repair of #{failed.node_id} (round {round_}): {said(kernel)}"
        return [self._proposal(kernel, model, mutation, plan, trail, repair_of=link.node_id)]

    async def _rewrite(self, ctx: ProposalContext, written_for: FailedSibling, link: FailedSibling) -> list[Proposal]:
        """The coder's kernel for the step whose reply (`link`, the latest of a chain starting at `written_for`)
        could not be used, told why; by the model that wrote it when it is one of the coders."""
        writer = written_for.proposer.removeprefix(f"{self.name}:")
        model = writer if writer in self.coders else self.coder
        round_ = link.repair_round + 1
        fields = {
            **kernel_rules(),
            "card": card_text(ctx.card),
            "gpu": gpu_text(ctx.gpu, ctx.card),
            "kernel": kernel_text(ctx.parent.source, ctx.parent.plan),
            "task": written_for.summary.removesuffix(f": {UNUSABLE}"),
            "problem": link.reason.strip() or "(no reason recorded)",
        }
        messages = fit(load("rewrite"), self.settings.agents.prompt_tokens, fields, {})
        trail = Trail()
        kernel = await self._write(ctx.card, "coder", model, messages, ctx.parent.id, trail)
        mutation = f"rewrite of #{link.node_id} (round {round_}): {said(kernel)}"
        return [self._proposal(kernel, model, mutation, ctx.parent.plan, trail, repair_of=link.node_id)]

    async def _new_candidates(self, ctx: ProposalContext, count: int) -> list[Proposal]:
        analysis = await self._analysis(ctx)
        strategies: list[Strategy] = []
        for _ in range(count):
            try:
                strategies.append(await self._plan(ctx, analysis, [s.title for s in strategies]))
            except LOST:
                if not strategies:
                    raise
                break
        titles = [s.title for s in strategies]
        return await settle(
            [self._candidate(ctx, analysis, s, [t for t in titles if t != s.title]) for s in strategies]
        )

    async def _analysis(self, ctx: ProposalContext) -> Analysis:
        """The analyst's diagnosis of the parent; without an analyst (or when it fails) the hardware report as it
        is, which already holds only the class and its metrics."""
        profile = ctx.parent.profile
        report = profile_text(profile)
        analyst = self.settings.roles.analyst
        if analyst is None or profile is None:
            return Analysis(report)
        if ctx.parent.id in self._analyses:
            return self._analyses[ctx.parent.id]
        fields = {
            "operator": operator_line(ctx.card),
            "gpu": gpu_text(ctx.gpu, ctx.card),
            "plan": plan_json(ctx.parent.plan),
            "speed": parent_speed(ctx.parent, ctx.gpu),
            "ptxas": ptxas_text(ctx.parent),
            "report": report,
        }
        messages = fit(load("analyst"), self.settings.agents.prompt_tokens, fields, {})
        try:
            answer = await self.client.ask("analyst", analyst, messages, parse_text, node_id=ctx.parent.id)
        except LOST:
            return Analysis(report)
        analysis = Analysis(f"{profile.hardware.summary()}\n{answer.value}", ids(answer))
        self._analyses[ctx.parent.id] = analysis
        return analysis

    async def _plan(self, ctx: ProposalContext, analysis: Analysis, planned: list[str], critique: str = "") -> Strategy:
        parent = ctx.parent
        fields = {
            "card": card_text(ctx.card),
            "gpu": gpu_text(ctx.gpu, ctx.card),
            "kernel": kernel_text(parent.source, parent.plan),
            "speed": parent_speed(parent, ctx.gpu),
            "analysis": analysis.text,
            "ptxas": ptxas_text(parent),
            "planned": bullets(planned, "(nothing yet)"),
            "hints": bullets(ctx.hints, "(none)"),
            "critique": critique,
        }
        listings = {"lineage": lineage_listing(ctx.lineage), "failures": failures_listing(ctx.failed_siblings)}
        messages = fit(load("planner"), self.settings.agents.prompt_tokens, fields, listings)
        model = self.settings.roles.planner or self.coder
        answer = await self.client.ask("planner", model, messages, parse_strategy, node_id=parent.id)
        return replace(answer.value, calls=ids(answer))

    async def _candidate(
        self, ctx: ProposalContext, analysis: Analysis, strategy: Strategy, others: list[str]
    ) -> list[Proposal]:
        """Code the strategy and have it judged; a low score sends it back to the planner while rounds remain.
        The last round's kernel is submitted (a re-plan that fails keeps the kernel already written)."""
        agents = self.settings.agents
        trail = Trail(list(analysis.calls))
        round_ = 1
        while True:
            trail.calls += strategy.calls
            fields = {
                **kernel_rules(),
                "card": card_text(ctx.card),
                "gpu": gpu_text(ctx.gpu, ctx.card),
                "kernel": kernel_text(ctx.parent.source, ctx.parent.plan),
                "strategy": strategy.text,
            }
            messages = fit(load("coder"), agents.prompt_tokens, fields, {})
            kernel = await self._write(ctx.card, "coder", self.coder, messages, ctx.parent.id, trail)
            verdict = None if isinstance(kernel, Rejection) else await self._judge(ctx, analysis, strategy, kernel)
            trail.calls += ids(verdict) if verdict is not None else ()
            score = verdict.value.score if verdict is not None else None
            proposal = self._proposal(kernel, self.coder, strategy.title, ctx.parent.plan, trail, judge_score=score)
            if verdict is None or verdict.value.score >= agents.judge_accept or round_ >= agents.planning_rounds:
                return [proposal]
            critique = (
                f"# Your previous strategy, and the judge's verdict on the kernel written from it\n{strategy.text}\n"
                f"Score {verdict.value.score:.2f} of 1: {verdict.value.critique}\n"
                "Revise the strategy so that it answers the critique."
            )
            try:
                strategy = await self._plan(ctx, analysis, others, critique)
            except LOST:
                return [proposal]
            round_ += 1

    async def _judge(
        self, ctx: ProposalContext, analysis: Analysis, strategy: Strategy, kernel: KernelReply
    ) -> Answer[Verdict] | None:
        """The judge's verdict, or None without a judge or when it fails (the kernel then goes in unscored)."""
        judge = self.settings.roles.judge
        if judge is None:
            return None
        before, after = ctx.parent.source.splitlines(keepends=True), kernel.source.splitlines(keepends=True)
        diff = "".join(difflib.unified_diff(before, after, "parent.cu", "candidate.cu"))
        fields = {
            "card": card_text(ctx.card),
            "gpu": gpu_text(ctx.gpu, ctx.card),
            "analysis": analysis.text,
            "strategy": strategy.text,
            "diff": diff or "(the source is unchanged)",
            "plans": f"{plan_json(ctx.parent.plan)}\n->\n{plan_json(kernel.plan)}",
        }
        messages = fit(load("judge"), self.settings.agents.prompt_tokens, fields, {})
        try:
            return await self.client.ask("judge", judge, messages, parse_verdict, node_id=ctx.parent.id)
        except LOST:
            return None

    # ---- writing a kernel ------------------------------------------------------------------------------------------

    async def _write(
        self,
        card: OperatorCard,
        role: Role,
        model: str,
        messages: list[ChatMessage],
        node_id: int,
        trail: Trail,
    ) -> KernelReply | Rejection:
        """A kernel parsed strictly from `model`'s reply. A reply that cannot be used gets one request to fix it
        (the reply and what is wrong with it); a second one is a Rejection that keeps it. A reply cut off at
        max_tokens is asked for again without it, with a larger budget where the model's limit allows, and the
        operator is told. Every call, the unusable ones included, is added to the trail."""

        def parse(text: str) -> KernelReply:
            return parse_kernel(text, card)

        try:
            answer = await self.client.ask(role, model, messages, parse, node_id=node_id)
        except Malformed as bad:
            trail.add(bad.call)
            retry, max_tokens = fix_request(messages, bad.reply or None, str(bad)), None
            if isinstance(bad, Truncated):
                retry, max_tokens = cut_request(messages), self._fix_up_tokens(model, bad.max_tokens)
                trail.notes.append(cut_note(role, self.settings.model(model), bad.max_tokens, max_tokens))
            try:
                answer = await self.client.ask(role, model, retry, parse, node_id=node_id, max_tokens=max_tokens)
            except Malformed as again:
                trail.add(again.call)
                return Rejection(again.reply or f"// the model's reply was empty: {again}\n", str(again))
        trail.add(answer.call)
        return answer.value

    def _fix_up_tokens(self, model: str, cut_at: int) -> int:
        """The budget of the request after a reply cut at `cut_at` tokens: twice as many, within the model's
        `max_tokens_limit` (without one, the same: the request is shorter instead)."""
        limit = self.settings.model(model).max_tokens_limit or cut_at
        return max(cut_at, min(2 * cut_at, limit))

    def _proposal(
        self,
        kernel: KernelReply | Rejection,
        model: str,
        mutation: str,
        plan: LaunchPlan,
        trail: Trail,
        *,
        repair_of: int | None = None,
        judge_score: float | None = None,
    ) -> Proposal:
        proposer = f"{self.name}:{model}"
        if isinstance(kernel, Rejection):
            return Proposal(
                source=kernel.reply,
                plan=plan,
                mutation=mutation,
                proposer=proposer,
                repair_of=repair_of,
                llm_calls=list(trail.calls),
                notes=list(trail.notes),
                rejected=kernel.problem,
            )
        return Proposal(
            source=kernel.source,
            plan=kernel.plan,
            mutation=mutation,
            proposer=proposer,
            repair_of=repair_of,
            judge_score=judge_score,
            llm_calls=list(trail.calls),
            notes=list(trail.notes),
        )


def kernel_rules() -> dict[str, str]:
    """What every prompt that asks for a kernel says about it: the rules (with their file's id) and the form."""
    rules = load("rules")
    return {"rules": f"[{rules.id}]\n{rules.text()}", "reply_format": REPLY_FORMAT}


def cut_request(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The conversation again, without the reply that was cut off (it would make the request longer by a whole
    budget of tokens), its last user message asking for a shorter answer."""
    ask = load("cut_off").text(reply_format=REPLY_FORMAT)
    last = messages[-1]
    return [*messages[:-1], ChatMessage(role="user", content=f"{last.content}\n\n{ask}")]


def cut_note(role: Role, model: ModelSettings, cut_at: int, fix_up: int) -> str:
    """The operator's log line for a reply cut off at max_tokens: what was done, and the setting that avoids it."""
    budget = f"{fix_up} tokens" if fix_up > cut_at else f"the same {cut_at} tokens (no max_tokens_limit is set)"
    return (
        f"the {role}'s reply from {model.name} was cut off at max_tokens ({cut_at}): asked again, without the cut "
        f"reply, for a shorter answer with {budget}; raise max_tokens for {model.name} under [[llm.models]] (and "
        "max_tokens_limit, the most a retry may ask for) to avoid the extra call"
    )


def fix_request(messages: list[ChatMessage], reply: str | None, problem: str) -> list[ChatMessage]:
    """The conversation with one more turn asking to fix the reply. With no reply to show back (an empty one) the
    request joins the last user message (roles must alternate on the Anthropic API)."""
    ask = load("reformat").text(problem=problem, reply_format=REPLY_FORMAT)
    if reply is None:
        last = messages[-1]
        return [*messages[:-1], ChatMessage(role="user", content=f"{last.content}\n\n{ask}")]
    return [*messages, ChatMessage(role="assistant", content=reply), ChatMessage(role="user", content=ask)]
