"""The agent team and the hybrid proposer against a real HTTP server on loopback that replays scripted replies by
the prompt asking: what each role's prompt carries (read from the request bodies the server saw), strict replies
and their one repair request, the debugger's rounds, the judge's rounds, the pool of first kernels, the hybrid's
mix, and prompts fitted into their budget."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from string import Template
from typing import Any

import pytest

from kernelforge_tui.cards.directory import Card, load_card
from kernelforge_tui.config import LlmSettings
from kernelforge_tui.errors import BadInput
from kernelforge_tui.llm import LlmClient, LlmError, Malformed
from kernelforge_tui.proposers.agents import UNUSABLE, AgentProposer
from kernelforge_tui.proposers.base import (
    FailedSibling,
    LineageStep,
    ParentInfo,
    Proposal,
    ProposalContext,
    TargetGpu,
)
from kernelforge_tui.proposers.hybrid import HybridProposer
from kernelforge_tui.proposers.prompting import Entry, Listing, Prompt, estimate_tokens, fit, load, message_tokens
from kernelforge_tui.proposers.replies import REPLY_FORMAT
from kernelforge_tui.proposers.role_replies import parse_strategy, parse_verdict
from kernelforge_tui.proposers.sections import card_text
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.store import RunStore
from kernelforge_tui.vocabulary.evaluation import Ceilings, Diagnostic, PtxasStats
from kernelforge_tui.vocabulary.nodes import FailureKind
from kernelforge_tui.vocabulary.profiles import NodeProfile
from tests.support.fakes.agent_replies import (
    CARD_DIR,
    KERNEL,
    PLAN,
    ROOT,
    RecordingSink,
    Script,
    conversation,
    kernel,
    strategy,
    streamed,
    text_of,
    verdict,
)
from tests.support.fakes.llm_server import LlmServer, Reply

MODELS = ("coder-a", "coder-b", "coder-c", "analyst", "planner", "debugger", "judge")
PARENT_ID = 7
FAILED_SOURCE = "// FAILED-SOURCE-MARK\n" + KERNEL


@pytest.fixture(scope="module")
def card() -> Card:
    return load_card(CARD_DIR)


@pytest.fixture(scope="module")
def profile() -> NodeProfile:
    with RunStore.open(ROOT / "examples" / "runs" / "rms_norm_bf16_profiled", readonly=True) as store:
        recorded = store.profile(1)
    assert recorded is not None
    return recorded


def settings(
    server: LlmServer,
    protocol: str,
    roles: dict[str, Any],
    agents: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> LlmSettings:
    provider = {
        "name": "fake",
        "protocol": protocol,
        "base_url": f"{server.url}/v1" if protocol == "openai" else server.url,
        "timeouts": {"connect_s": 2, "idle_s": 2, "total_s": 10},
        "retries": {"max_attempts": 1, "backoff_s": 0.01},
    }
    models = [{"name": name, "provider": "fake", "model": f"m-{name}", **(model or {})} for name in MODELS]
    return LlmSettings.model_validate(
        {"providers": [provider], "models": models, "roles": roles, "agents": agents or {}}
    )


@asynccontextmanager
async def team(
    script: Script,
    roles: dict[str, Any],
    agents: dict[str, Any] | None = None,
    protocol: str = "openai",
    coder_order: list[str] | None = None,
    model: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[AgentProposer, RecordingSink, LlmServer]]:
    """`model`: fields every model gets (max_tokens, ...)."""
    sink = RecordingSink()
    with LlmServer(responder=script) as server:
        llm = settings(server, protocol, roles, agents, model)
        async with LlmClient(llm, sink) as client:
            yield AgentProposer(client, llm, coder_order), sink, server


def context(card: Card, profile: NodeProfile | None = None, **fields: Any) -> ProposalContext:
    assert card.spec.baseline is not None
    parent = ParentInfo(
        id=PARENT_ID,
        source=card.baseline_source(),
        plan=card.spec.baseline.plan,
        speedup=1.25,
        latency_us=12.5,
        ceiling_share=0.45,
        profile=profile,
        ptxas=PtxasStats(registers=40),
    )
    lineage = [LineageStep(id=1, mutation="baseline (the card's)", speedup=1.0)]
    lineage.append(LineageStep(id=PARENT_ID, mutation="LINEAGE-MARK two rows per block", speedup=1.25))
    return ProposalContext(card=card.spec, card_dir=card.root, parent=parent, lineage=lineage, **fields)


def failed(node_id: int, proposer: str = "agents:coder-a", **fields: Any) -> FailedSibling:
    values: dict[str, Any] = {
        "summary": f"attempt {node_id}",
        "failure": FailureKind.MISMATCH,
        "reason": f"stress:large-logits: y[3, 17] = nan, expected 0.0123 (REASON-{node_id})",
        "source": FAILED_SOURCE,
        "plan": PLAN,
        **fields,
    }
    return FailedSibling(node_id=node_id, proposer=proposer, **values)


def system(seen_text: str) -> str:
    return seen_text.splitlines()[0]


# ---- what each role's prompt carries ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
async def test_each_role_gets_what_it_must_and_the_proposal_records_the_team(
    card: Card, profile: NodeProfile, protocol: str
) -> None:
    script = Script(
        {
            "analyst": ["DIAG-MARK: DRAM reads are scattered; coalesce them."],
            "planner": [strategy("One warp per row, 16-byte loads", "PLAN-MARK: vectorise the row loads.")],
            "coder": [kernel()],
            "judge": [verdict(0.8, "attacks the  scattered\nreads")],
        }
    )
    roles = {"analyst": "analyst", "planner": "planner", "coder": ["coder-a"], "judge": "judge"}
    sibling = failed(9, "templates", failure=FailureKind.COMPILE, reason='candidate.cu(12): "VEC" is undefined')
    ctx = context(card, profile, failed_siblings=[sibling], hints=["HINT-MARK try one warp per row"])
    async with team(script, roles, protocol=protocol) as (proposer, sink, server):
        (proposal,) = await proposer.propose(ctx, 1)
    assert all(
        s.path.endswith("/v1/messages" if protocol == "anthropic" else "/chat/completions") for s in server.requests
    )
    assert script.left() == {}

    (analyst,) = script.asked("analyst")
    text = text_of(analyst)
    assert system(text) == "[prompt analyst.v2]" and analyst.body["model"] == "m-analyst"
    assert "memory-bandwidth-bound" in text and "DRAM throughput" in text and "long_scoreboard" in text
    assert "dram__bytes" not in text and "c2clink__present" not in text  # only the class's metrics
    assert "40 registers per thread" in text
    assert "Measured so far: 1.25x the baseline, 12.50 us a call (median), 45% of the measured ceiling" in text

    (planner,) = script.asked("planner")
    text = text_of(planner)
    assert system(text) == "[prompt planner.v2]" and planner.body["model"] == "m-planner"
    for expected in (
        "softmax(x) over the last axis",  # the card's description
        "rows = 21, cols = 1003",
        "|out - ref| <= 1e-08 + 0.016 * |ref|",
        "stress:large-logits",
        "softmax_naive_bf16",  # the parent kernel
        "1.25x the baseline, 12.50 us a call (median), 45% of the measured ceiling",  # as the metrics pane says
        "LINEAGE-MARK",
        "DIAG-MARK",
        "40 registers per thread",
        '"VEC" is undefined',
        "HINT-MARK",
    ):
        assert expected in text, expected

    (coder,) = script.asked("coder")
    text = text_of(coder)
    assert system(text) == "[prompt coder.v2]" and coder.body["model"] == "m-coder-a"
    assert "[rules.v1]" in text and REPLY_FORMAT in text and 'extern "C"' in text
    assert "PLAN-MARK" in text and "softmax_naive_bf16" in text and "rows = 21" in text

    (judge,) = script.asked("judge")
    text = text_of(judge)
    assert system(text) == "[prompt judge.v2]" and judge.body["model"] == "m-judge"
    assert "DIAG-MARK" in text and "PLAN-MARK" in text
    assert card_text(card.spec) in text  # the same card section the coder gets
    assert "+++ candidate.cu" in text and '-extern "C" __global__ void softmax_naive_bf16' in text

    assert proposal.proposer == "agents:coder-a"
    assert proposal.mutation == "One warp per row, 16-byte loads"
    assert proposal.source == KERNEL and proposal.plan.entry == PLAN["entry"] and proposal.rejected is None
    assert proposal.judge_score == 0.8
    assert [c.role for c in sink.calls] == ["analyst", "planner", "coder", "judge"]
    assert sorted(proposal.llm_calls) == [1, 2, 3, 4]
    assert all(c.node_id == PARENT_ID and c.outcome == "ok" for c in sink.calls)


async def test_without_an_analyst_the_report_goes_as_it_is_and_no_profile_is_said(
    card: Card, profile: NodeProfile
) -> None:
    plan = strategy("Rows in registers")
    script = Script({"planner": [plan, plan], "coder": [kernel(), kernel()]})
    async with team(script, {"coder": ["coder-a"]}) as (proposer, sink, _):
        await proposer.propose(context(card, profile), 1)
        await proposer.propose(context(card, None), 1)
    profiled, unprofiled = (text_of(seen) for seen in script.asked("planner"))
    assert "\n".join(profile.hardware.lines()) in profiled
    assert "Not profiled" in unprofiled and "Not profiled" not in profiled
    assert {s.body["model"] for s in script.asked("planner")} == {"m-coder-a"}  # no planner: the coder plans
    assert "analyst" not in {c.role for c in sink.calls}


H200 = Ceilings(
    gpu_name="NVIDIA H200",
    copy_gbps=4250.0,
    fma_tflops=60.0,
    capability=(9, 0),
    sm_count=132,
    l2_bytes=60 << 20,
    shared_per_sm_bytes=228 << 10,
    shared_per_block_bytes=227 << 10,
    registers_per_sm=65536,
    threads_per_sm=2048,
)


async def test_every_role_is_told_the_gpu_its_worker_measured(card: Card, profile: NodeProfile) -> None:
    script = Script(
        {
            "first": [kernel()],
            "analyst": ["DRAM-bound."],
            "planner": [strategy("Rows in registers")],
            "coder": [kernel()],
            "judge": [verdict(0.9, "good")],
            "debugger": [kernel("Guarded the tail.")],
        }
    )
    roles = {"analyst": "analyst", "coder": ["coder-a"], "judge": "judge", "debugger": "debugger"}
    gpu = TargetGpu(name="NVIDIA H200", ceilings=H200)
    async with team(script, roles, {"pool_size": 1}) as (proposer, _, _):
        await proposer.propose(context(card, first_expansion=True, gpu=gpu), 1)
        await proposer.propose(context(card, profile, failed_siblings=[failed(20)], gpu=gpu), 2)
    for role in ("first", "analyst", "planner", "coder", "judge", "debugger"):
        (seen,) = script.asked(role)
        head = conversation(seen)[0][1]  # the system message
        for expected in (
            "NVIDIA H200, sm_90 (compute capability 9.0)",
            "132 SMs: one wave of a grid is 132 times the blocks that fit on one SM",
            "L2 cache 60 MiB",
            "Per SM: 228 KiB of shared memory, 65536 32-bit registers and 2048 threads",
            "Per block: at most 1024 threads and 227 KiB of shared memory",
            "4250 GB/s copy bandwidth",
            "960 TFLOP/s (the dense 16-bit tensor-core rate, derived)",  # a bf16 card: 16 x the FMA rate
            "thread block clusters",
            "cp.async.bulk",
        ):
            assert expected in head, (role, expected)
    simulated = Script({"planner": [strategy("x")] * 2, "coder": [kernel()] * 2})
    async with team(simulated, {"coder": ["coder-a"]}) as (proposer, _, _):
        await proposer.propose(context(card, gpu=TargetGpu(name="simulated (no GPU)", simulated=True)), 1)
        await proposer.propose(context(card), 1)
    said, unsaid = (conversation(seen)[0][1] for seen in simulated.asked("coder"))
    assert "this run is simulated (simulated (no GPU))" in said and "SMs" not in said
    assert "not measured yet" in unsaid
    planned = text_of(simulated.asked("planner")[0])
    assert "12.50 us a call (median), 45% of a simulated ceiling (no GPU measured it)" in planned


# ---- strict replies ------------------------------------------------------------------------------------------------


async def test_an_unusable_reply_gets_exactly_one_repair_request_then_becomes_a_rejected_proposal(card: Card) -> None:
    first, second = "Here is my idea in prose, no code.", "Still only prose, sorry."
    script = Script({"planner": [strategy("Rows in registers")], "coder": [first, second]})
    roles = {"coder": ["coder-a"], "judge": "judge"}
    async with team(script, roles) as (proposer, sink, _):
        (proposal,) = await proposer.propose(context(card), 1)
    asked, repair = script.asked("coder")
    assert len(script.asked("coder")) == 2 and script.asked("judge") == []
    assert conversation(repair)[:-2] == conversation(asked)
    assert conversation(repair)[-2] == ("assistant", first)
    role, ask = conversation(repair)[-1]
    assert role == "user" and "0 ```cuda blocks" in ask and REPLY_FORMAT in ask
    assert proposal.rejected is not None and "0 ```cuda blocks" in proposal.rejected
    assert proposal.source == second and proposal.plan == context(card).parent.plan
    assert [c.outcome for c in sink.calls if c.role == "coder"] == ["malformed", "malformed"]
    assert proposal.llm_calls == [*sink.ids("planner"), *sink.ids("coder")]  # the unusable replies' calls too


async def test_a_plan_that_fails_validation_is_sent_back_once_and_the_fix_is_used(card: Card) -> None:
    bad_plan = {key: value for key, value in PLAN.items() if key != "args"}
    script = Script({"planner": [strategy("Rows in registers")], "coder": [kernel(plan=bad_plan), kernel()]})
    async with team(script, {"coder": ["coder-a"]}) as (proposer, sink, _):
        (proposal,) = await proposer.propose(context(card), 1)
    _, repair = script.asked("coder")
    assert "the launch plan is not valid: args: Field required" in conversation(repair)[-1][1]
    assert proposal.rejected is None and proposal.plan.args == PLAN["args"] and proposal.source == KERNEL
    assert proposal.llm_calls == [*sink.ids("planner"), *sink.ids("coder")]  # the refused plan's call and the fix
    assert [c.outcome for c in sink.calls if c.role == "coder"] == ["malformed", "ok"]


@pytest.mark.parametrize(("protocol", "finish"), [("openai", "length"), ("anthropic", "max_tokens")])
@pytest.mark.parametrize(("limit", "fix_up"), [(3000, 2000), (1500, 1500), (None, 1000)])
async def test_a_reply_cut_off_at_max_tokens_is_asked_again_shorter_and_the_operator_is_told(
    card: Card, protocol: str, finish: str, limit: int | None, fix_up: int
) -> None:
    cut = Reply(chunks=("Kept the row in registers.\n```cuda\n", 'extern "C" __global__ void'), finish=finish)
    script = Script({"planner": [strategy("Rows in registers")], "coder": [cut, kernel()]})
    model = {"max_tokens": 1000, "max_tokens_limit": limit}
    async with team(script, {"coder": ["coder-a"]}, protocol=protocol, model=model) as (proposer, sink, _):
        (proposal,) = await proposer.propose(context(card), 1)
    asked, again = script.asked("coder")
    assert asked.body["max_tokens"] == 1000 and again.body["max_tokens"] == fix_up
    first, retry = conversation(asked), conversation(again)
    assert len(retry) == len(first) and retry[:-1] == first[:-1]  # the cut reply is not sent back: shorter
    role, ask = retry[-1]
    shorter = load("cut_off").text(reply_format=REPLY_FORMAT)
    assert role == "user" and ask == f"{first[-1][1]}\n\n{shorter}" and "cut off at the length limit" in shorter
    assert "max_tokens" not in ask  # the model is not told to change a setting
    assert proposal.rejected is None and proposal.source == KERNEL
    assert [c.outcome for c in sink.calls if c.role == "coder"] == ["malformed", "ok"]
    assert "cut off at max_tokens (1000)" in sink.calls[1].error  # the record says what happened
    (note,) = proposal.notes  # the operator is told, in the search's log
    assert "the coder's reply from coder-a was cut off at max_tokens (1000)" in note
    assert (f"with {fix_up} tokens" if limit else "the same 1000 tokens (no max_tokens_limit is set)") in note
    assert "raise max_tokens for coder-a under [[llm.models]]" in note


def test_a_max_tokens_limit_below_max_tokens_is_refused() -> None:
    model = {"name": "m", "provider": "p", "model": "x", "max_tokens": 4000, "max_tokens_limit": 2000}
    provider = {"name": "p", "protocol": "openai", "base_url": "http://127.0.0.1:1/v1"}
    with pytest.raises(ValueError, match=r"max_tokens_limit \(2000\) is below max_tokens \(4000\)"):
        LlmSettings.model_validate({"providers": [provider], "models": [model]})


def test_the_planners_and_the_judges_replies_are_read_strictly() -> None:
    assert parse_strategy("**Title:** One warp per row\nLoad 16 bytes.").title == "One warp per row"
    assert parse_strategy("# Rows in registers").text == "# Rows in registers"
    for bad in ("", "  \n ", "---\nthe plan"):
        with pytest.raises(Malformed):
            parse_strategy(bad)
    assert (
        parse_verdict('```json\n{"score": 0.25, "critique": "misses\\n the  tail"}\n```').critique == "misses the tail"
    )
    assert parse_verdict('{"score": 1, "critique": "good"}').score == 1
    for bad in (
        '{"score": 1.5, "critique": "x"}',
        '{"score": "0.5", "critique": "x"}',
        '{"score": 0.5}',
        '{"score": 0.5, "critique": "x", "extra": 1}',
        "Score: 0.5 - fine",
    ):
        with pytest.raises(Malformed, match=r"verdict is not valid|JSON object only"):
            parse_verdict(bad)


# ---- the debugger --------------------------------------------------------------------------------------------------


async def test_failed_agent_kernels_are_repaired_first_within_d_rounds(card: Card) -> None:
    fix = kernel("Guarded the tail loads so no thread reads past the row.")
    script = Script({"debugger": [fix, fix], "planner": [strategy("Rows in registers")], "coder": [kernel()]})
    siblings = [
        failed(20),
        failed(21, repair_round=2),  # D rounds already spent
        failed(22, repaired=True),
        failed(23, "templates"),
        failed(24, failure=FailureKind.COMPILE, repair_round=1),
    ]
    roles = {"coder": ["coder-a"], "debugger": "debugger"}
    async with team(script, roles, {"debug_rounds": 2}) as (proposer, sink, _):
        proposals = await proposer.propose(context(card, failed_siblings=siblings), 3)
    repairs = {p.repair_of: p for p in proposals if p.repair_of is not None}
    assert set(repairs) == {20, 24} and len(proposals) == 3
    assert repairs[20].mutation == "repair of #20 (round 1): Guarded the tail loads so no thread reads past the row."
    assert repairs[24].mutation.startswith("repair of #24 (round 2): ")
    assert repairs[20].proposer == "agents:debugger" and repairs[20].source == KERNEL
    texts = {int(t.split("REASON-")[1].split(")")[0]): t for t in map(text_of, script.asked("debugger"))}
    assert set(texts) == {20, 24}
    assert system(texts[20]) == "[prompt debugger.v2]" and "FAILED-SOURCE-MARK" in texts[20]
    assert "How it failed: mismatch (repair 1 of at most 2)" in texts[20] and "y[3, 17] = nan" in texts[20]
    assert "How it failed: compile (repair 2 of at most 2)" in texts[24]
    assert sorted(c.node_id or 0 for c in sink.calls if c.role == "debugger") == [20, 24]
    assert [p.mutation for p in proposals if p.repair_of is None] == ["Rows in registers"]


async def test_the_debugger_reads_the_builds_messages_errors_first_against_numbered_lines(card: Card) -> None:
    warnings = [
        Diagnostic(line=3, severity="warning", message=f"WARNING-{i}", source_line="  int unused;") for i in range(4)
    ]
    message = 'ERROR-{} "VEC" is\n undefined'  # a message over two lines is read as one
    errors = [
        Diagnostic(line=10 + i, column=5, severity="error", message=message.format(i), source_line=f"  v = VEC({i});")
        for i in range(22)
    ]
    reason = "compile error: line 10: ERROR-0"
    sibling = failed(24, failure=FailureKind.COMPILE, reason=reason, diagnostics=[*warnings, *errors])
    script = Script({"debugger": [kernel("Defined VEC.")]})
    async with team(script, {"coder": ["coder-a"], "debugger": "debugger"}) as (proposer, _, _):
        await proposer.propose(context(card, failed_siblings=[sibling]), 1)
    (seen,) = script.asked("debugger")
    text = text_of(seen)
    shown = text.split("# What the compiler and the source check said about it (errors first)\n")[1]
    lines = shown.splitlines()
    assert lines[0] == 'candidate.cu:10:5: error: ERROR-0 "VEC" is undefined' and lines[1] == "    10 |   v = VEC(0);"
    assert [line.split(": ")[2] for line in lines[0:40:2]] == [f'ERROR-{i} "VEC" is undefined' for i in range(20)]
    assert "WARNING-0" not in shown and lines[40] == "(6 more messages left out)"
    numbered = FAILED_SOURCE.splitlines()
    width = len(str(len(numbered)))
    assert f"{1:>{width}} | // FAILED-SOURCE-MARK" in text and f"{len(numbered)} | {numbered[-1]}" in text


async def test_an_unusable_reply_goes_back_to_the_role_that_was_writing_not_to_the_debugger(card: Card) -> None:
    unusable = "the model's reply could not be used (kept as the source): the reply has 0 ```cuda blocks"
    prose = {"failure": FailureKind.MALFORMED, "reason": unusable, "source": "Only prose.", "plan": None}
    again = prose | {"repair_round": 1}
    # a coder's unusable reply; a kernel that failed and the debugger's unusable reply to it; an unusable first
    # kernel and the unusable rewrite of it
    siblings = [
        failed(30, "agents:coder-b", summary="Rows in registers", **prose),
        failed(24, failure=FailureKind.COMPILE, repaired=True),
        failed(31, "agents:debugger", summary=f"repair of #24 (round 1): {UNUSABLE}", repair_of=24, **again),
        failed(32, summary=f"first kernel by coder-a: {UNUSABLE}", repaired=True, **prose),
        failed(33, summary=f"rewrite of #32 (round 1): {UNUSABLE}", repair_of=32, **again),
    ]
    script = Script({"rewrite": [kernel("Rewrote it.")] * 2, "debugger": [kernel("Fixed the signature.")]})
    roles = {"coder": ["coder-a", "coder-b"], "debugger": "debugger"}
    async with team(script, roles, {"debug_rounds": 3}) as (proposer, _, _):
        proposals = await proposer.propose(context(card, failed_siblings=siblings), 3)
    by_link = {p.repair_of: p for p in proposals}
    assert set(by_link) == {30, 31, 33}
    assert by_link[30].mutation == "rewrite of #30 (round 1): Rewrote it." and by_link[30].proposer == "agents:coder-b"
    assert by_link[33].mutation == "rewrite of #33 (round 2): Rewrote it." and by_link[33].proposer == "agents:coder-a"
    assert by_link[31].mutation.startswith("repair of #24 (round 2): ") and by_link[31].proposer == "agents:debugger"
    rewrites = {seen.body["model"]: text_of(seen) for seen in script.asked("rewrite")}
    assert system(rewrites["m-coder-b"]) == "[prompt rewrite.v1]" and "Only prose." not in rewrites["m-coder-b"]
    for model, task in (("m-coder-b", "Rows in registers"), ("m-coder-a", "first kernel by coder-a")):
        assert f"# The step the kernel was to make\n{task}\n" in rewrites[model]
        assert "0 ```cuda blocks" in rewrites[model] and "softmax_naive_bf16" in rewrites[model]  # the parent
    (debugged,) = (text_of(seen) for seen in script.asked("debugger"))  # for #24's kernel, never for prose
    assert "FAILED-SOURCE-MARK" in debugged and "REASON-24" in debugged and "Only prose." not in debugged
    assert "How it failed: compile (repair 2 of at most 3)" in debugged


async def test_with_no_debug_rounds_nothing_is_repaired(card: Card) -> None:
    script = Script({"planner": [strategy("Rows in registers")], "coder": [kernel()]})
    async with team(script, {"coder": ["coder-a"]}, {"debug_rounds": 0}) as (proposer, _, _):
        (proposal,) = await proposer.propose(context(card, failed_siblings=[failed(20)]), 1)
    assert proposal.repair_of is None and script.asked("debugger") == []


# ---- the judge and the planning rounds -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rounds", "scores", "planned", "final"),
    [(1, [0.2], 1, 0.2), (2, [0.2, 0.3], 2, 0.3), (3, [0.2, 0.9], 2, 0.9), (3, [0.7], 1, 0.7)],
)
async def test_a_low_judge_score_goes_back_to_the_planner_while_rounds_remain(
    card: Card, rounds: int, scores: list[float], planned: int, final: float
) -> None:
    plans = [strategy(f"Strategy {i}", f"STRATEGY-{i}-MARK") for i in range(planned)]
    verdicts = [verdict(score, f"CRITIQUE-{i}-MARK misses the bottleneck") for i, score in enumerate(scores)]
    script = Script({"planner": plans, "coder": [kernel()] * planned, "judge": verdicts})
    roles = {"coder": ["coder-a"], "judge": "judge"}
    async with team(script, roles, {"planning_rounds": rounds, "judge_accept": 0.5}) as (proposer, sink, _):
        (proposal,) = await proposer.propose(context(card), 1)
    assert script.left() == {}
    asked = [text_of(s) for s in script.asked("planner")]
    assert len(asked) == planned
    for i, text in enumerate(asked[1:], start=1):
        assert f"CRITIQUE-{i - 1}-MARK" in text and f"STRATEGY-{i - 1}-MARK" in text
    assert proposal.judge_score == final and proposal.mutation == f"Strategy {planned - 1}"
    assert sorted(proposal.llm_calls) == [c.id for c in sink.calls]


async def test_a_judge_reply_that_cannot_be_read_leaves_the_kernel_unscored(card: Card) -> None:
    script = Script({"planner": [strategy("Rows in registers")], "coder": [kernel()], "judge": ["Looks great: 9/10"]})
    async with team(script, {"coder": ["coder-a"], "judge": "judge"}, {"planning_rounds": 2}) as (proposer, sink, _):
        (proposal,) = await proposer.propose(context(card), 1)
    assert proposal.judge_score is None and proposal.rejected is None
    assert len(script.asked("planner")) == 1 and [c.outcome for c in sink.calls if c.role == "judge"] == ["malformed"]


# ---- several candidates, lost ones, cancellation ---------------------------------------------------------------


async def test_each_candidate_gets_its_own_strategy_and_a_provider_error_loses_only_that_one(card: Card) -> None:
    script = Script(
        {
            "planner": [strategy("First idea"), strategy("Second idea")],
            "coder": [Reply(status=500, error="overloaded"), kernel()],
        }
    )
    sibling = failed(9, "templates", summary="FAILED-SUMMARY-MARK")
    async with team(script, {"coder": ["coder-a"]}) as (proposer, _, _):
        proposals = await proposer.propose(context(card, failed_siblings=[sibling]), 2)
    first, second = (text_of(s) for s in script.asked("planner"))
    assert "FAILED-SUMMARY-MARK" in first and "FAILED-SUMMARY-MARK" in second
    planned = second.split("Already planned for this kernel in this expansion")[1]
    assert "First idea" in planned and "First idea" not in first.split("Already planned")[1]
    assert len(proposals) == 1 and len(script.asked("coder")) == 2


@pytest.mark.parametrize("down", ["planner", "coder"])
async def test_when_every_candidate_is_lost_the_provider_error_is_raised(card: Card, down: str) -> None:
    replies: dict[str, list[str | Reply]] = {"planner": [strategy("Only idea")], "coder": [kernel()]}
    replies[down] = [Reply(status=500, error="overloaded")]
    script = Script(replies)
    async with team(script, {"coder": ["coder-a"]}) as (proposer, _, _):
        with pytest.raises(LlmError, match="overloaded"):
            await proposer.propose(context(card), 1)


async def test_cancelling_an_expansion_cancels_the_call(card: Card) -> None:
    script = Script({"planner": [strategy("Rows in registers")], "coder": [Reply(chunks=("``", "`cuda"), end="hold")]})
    async with team(script, {"coder": ["coder-a"]}) as (proposer, sink, _):
        task = asyncio.create_task(proposer.propose(context(card), 1))
        while not script.asked("coder"):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the coder's first chunk is on its way; the server holds the rest
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert [c.outcome for c in sink.calls] == ["ok", "cancelled"]


# ---- the pool of first kernels -------------------------------------------------------------------------------------


async def test_the_top_k_coders_each_write_a_first_kernel_at_once_and_one_failing_does_not_sink_the_others(
    card: Card,
) -> None:
    first = streamed(kernel("One block per row, the row in registers."), delay_s=0.2)
    down = Reply(status=500, error="model down", delay_s=0.6)
    script = Script({"first@m-coder-b": [down], "first": [first]})
    roles = {"coder": ["coder-a", "coder-b", "coder-c"]}
    async with team(script, roles, {"pool_size": 2}, coder_order=["coder-c", "coder-b", "coder-a"]) as (
        proposer,
        sink,
        _,
    ):
        assert proposer.seeds(card) == []
        proposals = await proposer.propose(context(card, first_expansion=True), 4)
    assert sorted(s.body["model"] for s in script.asked("first")) == ["m-coder-b", "m-coder-c"]
    # asked at once, not one after the other: each call started before the other one ended
    written, failed = (next(c for c in sink.calls if c.model == m) for m in ("m-coder-c", "m-coder-b"))
    assert written.latency_s > 0.5 and failed.latency_s > 0.5 and failed.outcome == "error"
    assert written.at - written.latency_s < failed.at and failed.at - failed.latency_s < written.at
    (proposal,) = proposals
    assert proposal.proposer == "agents:coder-c"
    assert proposal.mutation == "first kernel by coder-c: One block per row, the row in registers."
    text = text_of(script.asked("first")[0])
    assert system(text) == "[prompt first.v2]" and "softmax_naive_bf16" in text and "rows = 21" in text
    assert proposal.llm_calls == [c.id for c in sink.calls if c.model == "m-coder-c"]


# ---- the hybrid ----------------------------------------------------------------------------------------------------


class Empty:
    """A template library with nothing for this card."""

    name = "templates"

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        return []

    def seeds(self, card: Card) -> list[Proposal]:
        return []


def sources(proposals: list[Proposal]) -> list[str]:
    return [p.proposer.split(":")[0] for p in proposals]


async def test_hybrid_splits_each_expansion_and_the_other_side_fills_in(card: Card) -> None:
    ideas = [strategy(f"Idea {i}") for i in range(8)]
    script = Script({"planner": ideas, "coder": [kernel()] * 8})
    async with team(script, {"coder": ["coder-a"]}) as (agents, _, _):
        hybrid = HybridProposer(TemplateProposer(), agents)
        assert [p.source for p in hybrid.seeds(card)] == [p.source for p in TemplateProposer().seeds(card)]
        assert sorted(sources(await hybrid.propose(context(card), 4))) == ["agents"] * 2 + ["templates"] * 2
        odd = [sorted(sources(await hybrid.propose(context(card), 3))) for _ in range(2)]
        assert odd == [["agents", "templates", "templates"], ["agents", "agents", "templates"]]
        nothing = HybridProposer(Empty(), agents)
        assert sources(await nothing.propose(context(card), 3)) == ["agents"] * 3
    assert script.left() == {}


async def test_hybrid_keeps_the_templates_when_the_agents_fail_and_pools_at_the_root(card: Card) -> None:
    script = Script({"first": [kernel(), kernel()]})  # no planner reply: every new agent candidate fails
    async with team(script, {"coder": ["coder-a", "coder-b"]}, {"pool_size": 2}) as (agents, _, _):
        hybrid = HybridProposer(TemplateProposer(), agents)
        assert sources(await hybrid.propose(context(card), 4)) == ["templates"] * 4
        pooled = await hybrid.propose(context(card, first_expansion=True), 4)
        with pytest.raises(LlmError):
            await HybridProposer(Empty(), agents).propose(context(card), 2)
    assert sorted(p.proposer for p in pooled[:2]) == ["agents:coder-a", "agents:coder-b"]
    assert sources(pooled[2:]) == ["templates"] * 2


# ---- fitting prompts into their budget -----------------------------------------------------------------------------


def test_fitting_summarises_the_oldest_entries_first_then_leaves_them_out() -> None:
    """Entries are 100 tokens in full, 20 summarised; the two listings share one age order."""
    prompt = Prompt("test.v1", Template("s"), Template("$old\n$new"))

    def entries(ages: range) -> Listing:
        return Listing([Entry(a, f"full {a} " + "x" * 393, f"short {a} " + "y" * 73) for a in ages], "older", "")

    listings = {"old": entries(range(1, 4)), "new": entries(range(4, 6))}

    def lines(budget: int) -> list[str]:
        messages = fit(prompt, budget, {}, listings)
        assert message_tokens(messages) <= budget or budget == 10
        return [" ".join(line.split()[:2]) for line in messages[1].content.splitlines()]

    assert lines(600) == ["full 1", "full 2", "full 3", "full 4", "full 5"]
    assert lines(360) == ["short 1", "short 2", "full 3", "full 4", "full 5"]
    assert lines(200) == ["short 1", "short 2", "short 3", "short 4", "full 5"]
    assert lines(80) == ["(2 older", "short 3", "short 4", "short 5"]
    assert lines(10) == ["(3 older", "(2 older"]  # what cannot fit is sent as small as it gets


async def test_a_long_lineage_is_summarised_oldest_first_within_the_budget(card: Card) -> None:
    lineage = [LineageStep(id=i, mutation=f"STEP-{i} " + "unrolled " * 40, speedup=1 + i / 100) for i in range(1, 41)]
    failures = [failed(100 + i, "templates", reason=f"REASON-{i} " + "error: x\n" * 60) for i in range(4)]
    script = Script({"planner": [strategy("Rows in registers")], "coder": [kernel()]})
    budget = 5000
    async with team(script, {"coder": ["coder-a"]}, {"prompt_tokens": budget}) as (proposer, _, _):
        ctx = context(card, failed_siblings=failures).model_copy(update={"lineage": lineage})
        await proposer.propose(ctx, 1)
    (planner,) = script.asked("planner")
    text = text_of(planner)
    assert estimate_tokens(text) <= budget
    full = [f"STEP-{i} " + "unrolled " * 40 in text for i in range(1, 41)]
    assert not full[0] and full[-1] and full == sorted(full)  # a run of summaries, then the newest in full
    assert "#1 STEP-1 unrolled" in text  # summarised, not left out
    assert all(f"REASON-{i} " + "error: x\n" * 60 in text for i in range(4))  # the failures are newer: kept


async def test_the_team_needs_coders_it_knows() -> None:
    llm = LlmSettings.model_validate(
        {
            "providers": [{"name": "fake", "protocol": "openai", "base_url": "http://127.0.0.1:1"}],
            "models": [{"name": "coder-a", "provider": "fake", "model": "m"}],
        }
    )
    async with LlmClient(llm) as client:
        assert AgentProposer(client, llm).coders == ["coder-a"]
        with pytest.raises(BadInput, match="no usable coder model"):
            AgentProposer(client, llm, ["coder-z"])
