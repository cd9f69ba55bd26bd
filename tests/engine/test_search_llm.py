"""The engine's side of LLM proposers, for real: a proposer asking a loopback HTTP server through `LlmClient`, real
nvcc builds, the SQLite store, the simulated GPU. Calls are recorded and linked to the nodes they wrote, costs add
up exactly, the money and token budgets stop the search, a pause cancels a reply being written, a provider that keeps
failing stops the search, and the API key reaches neither the store nor the events."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernelforge_tui.config import (
    LlmSettings,
    ModelSettings,
    Price,
    ProviderSettings,
    Retries,
    RoleSettings,
    Timeouts,
    load_settings,
)
from kernelforge_tui.engine.backend import GpuBackend, SimulatedBackend, make_builder, target_gpu
from kernelforge_tui.engine.budget import Budget
from kernelforge_tui.engine.router import rank_coders
from kernelforge_tui.engine.search import MAX_LLM_FAILURES, Search
from kernelforge_tui.engine.settings import PipelineSettings, RunSettings
from kernelforge_tui.engine.tree import TreeSettings
from kernelforge_tui.gpu.detect import GpuInfo
from kernelforge_tui.llm import ChatMessage, FatalLlmError, LlmClient
from kernelforge_tui.proposers.base import Proposal, ProposalContext, TargetGpu
from kernelforge_tui.proposers.replies import parse_kernel
from kernelforge_tui.store import DB_NAME, RunStore
from kernelforge_tui.vocabulary.evaluation import Ceilings
from kernelforge_tui.vocabulary.events import BudgetUsed, EngineEvent, LlmCallEnded, LlmCallStarted, LlmText, LogLine
from kernelforge_tui.vocabulary.llm import ModelRecord
from tests.engine.test_search import make_card, toy_kernel
from tests.support.fakes.llm_server import LlmServer, Reply

KEY = "sk-test-SECRET-0123456789"
PRICE = Price(input=1.5, output=7.25)
"""USD per million tokens: per call of Reply's default 11 in / 5 out that is 11 * 1500 + 5 * 7250 nano-dollars."""
CALL_NANOUSD = 11 * 1500 + 5 * 7250


def kernel_reply(block: int, vec: int, speedup_fail: str | None = None) -> Reply:
    kernel = toy_kernel(block, vec, speedup_fail)
    text = f"Wider blocks.\n```cuda\n{kernel.source}```\n```json\n{kernel.plan.model_dump_json()}\n```\n"
    half = len(text) // 2
    return Reply(chunks=(text[:half], text[half:]))


def llm_settings(url: str, *, attempts: int = 1, price: Price | None = PRICE) -> LlmSettings:
    return LlmSettings(
        providers=[
            ProviderSettings(
                name="loop",
                protocol="openai",
                base_url=f"{url}/v1",
                api_key_env="KF_TEST_KEY",
                retries=Retries(max_attempts=attempts, backoff_s=0.01),
                timeouts=Timeouts(idle_s=5, total_s=20),
            )
        ],
        models=[ModelSettings(name="m", provider="loop", model="test-model", price=price)],
    )


class CoderProposer:
    """The smallest LLM proposer: one coder call per child, the reply parsed strictly."""

    name = "agents"

    def __init__(self, client: LlmClient) -> None:
        self.client = client
        self.contexts: list[ProposalContext] = []

    def seeds(self, card: object) -> list[Proposal]:
        return []

    async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
        self.contexts.append(ctx)
        out: list[Proposal] = []
        for _ in range(n):
            answer = await self.client.ask(
                "coder",
                "m",
                [ChatMessage(role="user", content=f"make node {ctx.parent.id} faster")],
                lambda text: parse_kernel(text, ctx.card),
                node_id=ctx.parent.id,
            )
            reply = answer.value
            out.append(
                Proposal(
                    source=reply.source,
                    plan=reply.plan,
                    mutation=reply.prose,
                    proposer="agents:m",
                    llm_calls=[answer.call.id or 0],
                    judge_score=1.0,
                )
            )
        return out


def make_search(tmp: Path, llm: LlmSettings, budget: Budget, max_expanding: int = 1) -> tuple[Search, CoderProposer]:
    card = make_card(tmp / "card")
    settings = load_settings()
    backend = SimulatedBackend(card, make_builder(settings), eval_seconds=0.005)
    run_dir = tmp / "run"
    if (run_dir / DB_NAME).exists():
        store = RunStore.resume(run_dir)
    else:
        store = RunStore.create(run_dir, card, backend.name, backend.gpu_name, RunSettings())
    client = LlmClient(llm)
    proposer = CoderProposer(client)
    run_settings = RunSettings(
        budget=budget,
        tree=TreeSettings(widening_k=2.0),
        pipeline=PipelineSettings(build_parallel=2, poll_s=0.05, stats_every_s=0.1, max_expanding=max_expanding),
    )
    return Search(card, proposer, backend, store, run_settings, llm=client), proposer


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> LlmServer:
    monkeypatch.setenv("KF_TEST_KEY", KEY)
    with LlmServer() as srv:
        yield srv


async def collect(search: Search) -> tuple[list[EngineEvent], object]:
    queue = search.subscribe()
    info = await search.run()
    events: list[EngineEvent] = []
    while not queue.empty():
        events.append(queue.get_nowait())
    return events, info


async def test_calls_are_recorded_linked_and_costed_exactly(tmp_path: Path, server: LlmServer) -> None:
    server.script(*(kernel_reply(b, v) for b, v in ((128, 1), (256, 2), (512, 4), (64, 2), (128, 4), (256, 4))))
    search, proposer = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=6))
    events, _ = await collect(search)
    store = search.store
    calls = store.llm_calls()
    assert len(calls) == 6 and all(c.outcome == "ok" and c.role == "coder" for c in calls)
    assert [c.cost_nanousd for c in calls] == [CALL_NANOUSD] * 6
    totals = store.llm_totals()
    assert totals.cost_nanousd == 6 * CALL_NANOUSD and totals.input_tokens == 66 and totals.output_tokens == 30
    written = [n for n in store.nodes() if n.proposer == "agents:m"]
    assert len(written) == 6 and all(n.status == "timed" for n in written)
    for node in written:  # every node knows the call that wrote it, and its judge score entered the reward
        (call,) = [c for c in store.llm_calls(node.id) if c.child_id == node.id]
        assert call.reply is not None and "```cuda" in call.reply and call.prompt is not None
        record = store.node_record(node.id)
        assert record.judge_score == 1.0 and record.reward is not None
        assert record.reward.term("judge") is not None and record.reward.term("judge").value == pytest.approx(0.1)
    assert all(c.first_token_s is not None and c.latency_s >= c.first_token_s for c in calls)
    ended = [e for e in events if isinstance(e, LlmCallEnded)]
    assert [e.totals.cost_nanousd for e in ended] == [CALL_NANOUSD * i for i in range(1, 7)]
    started = [e for e in events if isinstance(e, LlmCallStarted)]
    assert len(started) == 6 and {e.call_key for e in started} == {e.call_key for e in ended}
    streamed = "".join(e.text for e in events if isinstance(e, LlmText) and e.call_key == started[0].call_key)
    assert streamed == calls[0].reply  # the reply streamed to the views is the reply recorded
    budget = [e for e in events if isinstance(e, BudgetUsed)][-1]
    assert budget.tokens == 96 and budget.money_usd == pytest.approx(6 * CALL_NANOUSD / 1e9)
    assert proposer.contexts[0].gpu == TargetGpu(name="simulated (no GPU)", simulated=True)
    # the root's first expansion with an LLM team takes a whole batch (4), whatever the widening allows
    assert proposer.contexts[0].first_expansion and len(calls) > 4 and not proposer.contexts[-1].first_expansion
    assert len([n for n in written if n.parent_id == store.nodes()[0].id]) >= 4
    stored_kinds = {e.kind for _, e in store.events_since(0)}
    assert "llm_ended" in stored_kinds and "llm_text" not in stored_kinds  # streamed text stays in-process
    store.close()


async def test_the_calls_of_a_candidate_dropped_as_a_duplicate_are_linked_to_the_node_that_holds_it(
    tmp_path: Path, server: LlmServer
) -> None:
    server.script(*(kernel_reply(b, v) for b, v in ((128, 1), (256, 2), (128, 1), (512, 4))))
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=3))
    events, _ = await collect(search)
    first, _, again, _ = search.store.llm_calls()[:4]
    (node,) = [n for n in search.store.nodes() if first.child_id == n.id]
    assert again.child_id == node.id and len(search.store.nodes()) == 4  # the root and three, not four
    assert [c.id for c in search.store.llm_calls(node.id)] == [first.id, again.id]  # the conversation shows both
    logged = [e.text for e in events if isinstance(e, LogLine)]
    assert any(f"is the same as node {node.id}: dropped, its 1 LLM call linked to node {node.id}" in t for t in logged)
    search.store.close()


async def test_the_money_budget_stops_the_search_and_a_resume_counts_what_was_spent(
    tmp_path: Path, server: LlmServer
) -> None:
    server.script(*(kernel_reply(b, v) for b in (64, 128, 256, 512) for v in (1, 2, 4)))
    cap = 2.5 * CALL_NANOUSD / 1e9
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_money=cap))
    await collect(search)
    assert "money budget reached" in search.store.run_info().reason
    spent = search.store.llm_totals()
    assert spent.calls == 3 and spent.cost_usd >= cap  # the third call crossed the cap; no fourth went out
    assert len(server.requests) == 3 and all(c.outcome == "ok" for c in search.store.llm_calls())
    search.store.close()
    again, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_money=cap))
    assert again.meter.usage.money_nanousd == 3 * CALL_NANOUSD and again.meter.exhausted() is not None
    await again.run()
    assert len(server.requests) == 3  # resumed at the cap: it stops without asking
    again.store.close()


async def test_the_token_budget_stops_the_search(tmp_path: Path, server: LlmServer) -> None:
    server.script(*(kernel_reply(b, v) for b in (64, 128, 256, 512) for v in (1, 2, 4)))
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_tokens=32))
    await collect(search)
    assert "token budget reached (32 of 32" in search.store.run_info().reason
    assert search.store.llm_totals().calls == 2
    search.store.close()


async def test_a_pause_cancels_the_reply_being_written(tmp_path: Path, server: LlmServer) -> None:
    server.script(Reply(chunks=("```cuda\n", "never finished"), end="hold"))
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=2))
    run = asyncio.create_task(search.run())
    assert await asyncio.to_thread(server.first_chunk_sent.wait, 20)
    search.pause()
    assert await asyncio.to_thread(server.client_left.wait, 5)  # the HTTP stream was closed at once
    for _ in range(100):
        if search.store.llm_calls():
            break
        await asyncio.sleep(0.05)
    (call,) = search.store.llm_calls()
    assert call.outcome == "cancelled" and "paused or stopped" in call.error
    assert not search.expansions and not search.tree.root.exhausted  # the node may be expanded again
    search.stop("test over")
    await run
    search.store.close()


async def test_a_provider_that_keeps_failing_stops_the_search(tmp_path: Path, server: LlmServer) -> None:
    server.script(*(Reply(status=500, error=f"overloaded, key {KEY}") for _ in range(MAX_LLM_FAILURES)))
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=5))
    await collect(search)
    info = search.store.run_info()
    assert info.state == "finished" and f"failed {MAX_LLM_FAILURES} times in a row" in info.reason
    calls = search.store.llm_calls()
    assert [c.outcome for c in calls] == ["error"] * MAX_LLM_FAILURES and "HTTP 500" in calls[0].error
    assert KEY not in calls[0].error and "***" in calls[0].error
    search.store.close()


async def test_the_key_reaches_neither_the_store_nor_the_events(tmp_path: Path, server: LlmServer) -> None:
    server.script(kernel_reply(128, 1), Reply(status=401, error=f"bad key {KEY}"), kernel_reply(256, 1))
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=2))
    queue = search.subscribe()
    with pytest.raises(FatalLlmError) as refused:  # the refused key ends the run
        await search.run()
    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert KEY not in str(refused.value) and "***" in str(refused.value)
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent, to the provider only
    search.store.close()
    for path in (tmp_path / "run").iterdir():
        assert KEY.encode() not in path.read_bytes(), path
    assert all(KEY not in e.model_dump_json() for e in events)


async def test_expansions_run_side_by_side(tmp_path: Path, server: LlmServer) -> None:
    replies = [kernel_reply(b, v) for b in (64, 128, 256, 512) for v in (1, 2, 4)]
    server.script(*(Reply(chunks=r.chunks, chunk_delay_s=0.3) for r in replies))
    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=10), max_expanding=3)
    await collect(search)
    assert server.max_active >= 2  # calls of different expansions overlapped
    assert search.store.run_info().node_count == 11
    search.store.close()


async def test_a_rejected_reply_is_a_failed_node_that_keeps_the_reply(tmp_path: Path, server: LlmServer) -> None:
    class Rejecting(CoderProposer):
        async def propose(self, ctx: ProposalContext, n: int) -> list[Proposal]:
            rejected, notes = "the reply has 0 ```cuda blocks", ["NOTE-MARK for the operator"]
            return [Proposal(source="no code here", plan=ctx.parent.plan, mutation="?", proposer="agents:m",
                             rejected=rejected, notes=notes)]  # fmt: skip

    search, _ = make_search(tmp_path, llm_settings(server.url), Budget(max_iterations=1))
    search.proposer = Rejecting(search.llm)  # type: ignore[arg-type]
    events, _ = await collect(search)
    (note,) = [e for e in events if isinstance(e, LogLine) and "NOTE-MARK" in e.text]  # the proposal's notes
    assert note.level == "warning" and note.text == "NOTE-MARK for the operator"
    (node,) = [n for n in search.store.nodes() if n.parent_id is not None]
    assert node.status == "failed" and node.failure == "malformed" and "0 ```cuda blocks" in node.reason
    assert search.store.node_record(node.id).source == "no code here"
    search.store.close()


def test_the_proposers_are_told_the_gpu_its_worker_measured(tmp_path: Path) -> None:
    gpu = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-1", capability="9.0", driver="570", memory_mib=141000)
    settings = load_settings()
    backend = GpuBackend(make_card(tmp_path / "card"), settings, [gpu], make_builder(settings, gpu.arch))
    assert target_gpu(backend) == TargetGpu(name="NVIDIA H200")  # not measured yet
    measured = Ceilings(gpu_name="NVIDIA H200", copy_gbps=4250.0, fma_tflops=60.0, capability=(9, 0), sm_count=132,
                        l2_bytes=60 << 20, shared_per_sm_bytes=228 << 10)  # fmt: skip
    backend.evaluators[0].ceilings = measured
    assert target_gpu(backend) == TargetGpu(name="NVIDIA H200", ceilings=measured)


def test_the_router_ranks_coders_by_smoothed_success_on_the_family() -> None:
    llm = LlmSettings(
        providers=[ProviderSettings(name="p", protocol="openai", base_url="http://x/v1")],
        models=[ModelSettings(name=n, provider="p", model=f"id-{n}") for n in ("a", "b", "c")],
        roles=RoleSettings(coder=["a", "b", "c"]),
    )

    def record(model: str, kernels: int, correct: int) -> ModelRecord:
        return ModelRecord(provider="p", model=model, family="softmax", card="x", calls=kernels, kernels=kernels,
                           correct=correct, best_speedup=None, cost_nanousd=0, writing_cost_nanousd=0)  # fmt: skip

    assert rank_coders(llm, []) == ["a", "b", "c"]  # no record: the config's order
    # b: 9 of 10 correct beats the prior; a: 1 of 4 falls below it; c has no record (prior 0.5)
    assert rank_coders(llm, [record("id-a", 4, 1), record("id-b", 10, 9)]) == ["b", "c", "a"]
    assert rank_coders(llm, [record("id-c", 2, 2), record("id-b", 20, 19)]) == ["b", "c", "a"]
