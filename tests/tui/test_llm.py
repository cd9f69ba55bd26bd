"""The TUI with LLM agents, over the synthetic run given an agent team: the cost and token meters in the header,
a coder's reply streaming into the diff's place, one log line per call, the conversation behind a node, the
models compared, the judge's score and the repair link in the metrics; snapshots of the new screens."""

from __future__ import annotations

import json
from typing import Any

import pytest
from textual.pilot import Pilot

from kernelforge_tui.engine.backend import SIMULATED
from kernelforge_tui.tui.app import KernelForgeApp
from kernelforge_tui.tui.config import TuiSettings
from kernelforge_tui.tui.screens import ConversationScreen, ModelsScreen
from kernelforge_tui.tui.source import AgentFacts
from kernelforge_tui.tui.widgets import DiffPane, SearchTree, StreamPane
from kernelforge_tui.tui.widgets.llm_call import prompt_messages
from kernelforge_tui.vocabulary.events import LlmCallEnded, LlmCallStarted, LlmText
from kernelforge_tui.vocabulary.llm import LlmCall, LlmTotals, ModelRecord
from tests.support.fakes.synthetic import T0, SyntheticSource
from tests.support.fakes.tui import screen_text, settle

SYSTEM = "You are the coder of a team that writes fast CUDA kernels. Reply with one ```cuda block and one plan."
USER = (
    "Kernel #{parent} (row softmax, 4096x32768 fp32) is memory-bandwidth-bound at 61% of DRAM peak. "
    "The planner's strategy: load four floats per thread with float4, keep the running max and sum in registers, "
    "and reduce across the warp with shuffles before one shared-memory pass. Write the kernel."
)
REPLY = "```cuda\n__global__ void softmax_rows(const float* x, float* y, int cols) {\n  // float4 loads\n}\n```"


def call(role: str, node_id: int, child_id: int | None = None, **fields: Any) -> LlmCall:
    prompt = json.dumps(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER.format(parent=node_id)}]
    )
    values: dict[str, Any] = {
        "role": role,
        "provider": "openai",
        "model": "gpt-4.1",
        "prompt": prompt,
        "prompt_sha256": "a" * 64,
        "reply": REPLY,
        "reply_sha256": "b" * 64,
        "input_tokens": 1200,
        "output_tokens": 300,
        "cost_nanousd": 4_200_000,
        "latency_s": 3.25,
        "first_token_s": 0.8,
        "node_id": node_id,
        "child_id": child_id,
        "at": T0 + 30,
    }
    return LlmCall.model_validate(values | fields)


class AgentSource(SyntheticSource):
    """The synthetic run as an agent team would have written it: the calls behind its best node (a planner, a
    malformed coder reply, the coder that wrote it, a judge; one call kept only as hashes), the models compared,
    and the run's spend under caps. Calls in flight and ended come as events, as the engine emits them."""

    def __init__(self, nodes: int = 40) -> None:
        super().__init__(nodes)
        best = self.best
        assert best is not None and best.parent_id is not None
        self.best_id, self.parent_id = best.id, best.parent_id
        parent = best.parent_id
        self.calls = [
            call("planner", parent, output_tokens=120, cost_nanousd=1_500_000),
            call(
                "coder",
                parent,
                outcome="malformed",
                error="no ```cuda block in the reply",
                attempts=2,
                reply="I would use float4 loads.",
            ),
            call("coder", parent, best.id),
            call("judge", parent, best.id, prompt=None, reply=None, model="gpt-4.1-mini", cost_nanousd=90_000),
        ]
        self.calls = [c.model_copy(update={"id": i}) for i, c in enumerate(self.calls, 1)]
        failed = next(i for i, n in self.nodes.items() if n.status == "failed")
        self.facts = {best.id: AgentFacts(judge_score=0.82, repair_of=failed)}
        self.records = [
            ModelRecord(
                provider="anthropic",
                model="claude-sonnet-4",
                family="softmax",
                card="softmax_f32_4096x32768",
                calls=14,
                kernels=6,
                correct=4,
                best_speedup=1.62,
                cost_nanousd=310_000_000,
                writing_cost_nanousd=250_000_000,  # its planner's and judge's calls cost the rest
            ),
            ModelRecord(
                provider="openai",
                model="gpt-4.1",
                family="softmax",
                card="softmax_f32_4096x32768",
                calls=21,
                kernels=9,
                correct=6,
                best_speedup=best.speedup,
                cost_nanousd=920_000_000,
                writing_cost_nanousd=810_000_000,
            ),
        ]
        self.totals = LlmTotals(calls=35, input_tokens=41_000, output_tokens=4_600, cost_nanousd=1_230_000_000)
        self.budget = self.budget.model_copy(update={"max_money_usd": 5.0, "max_tokens": 2_000_000})

    def snapshot(self) -> Any:
        return super().snapshot().model_copy(update={"llm_totals": self.totals})

    def llm_calls(self, node_id: int) -> list[LlmCall]:
        self._reading()
        return [c for c in self.calls if node_id in (c.node_id, c.child_id)]

    def model_records(self) -> list[ModelRecord]:
        self._reading()
        return list(self.records)

    def agent_facts(self, node_id: int) -> AgentFacts | None:
        self._reading()
        return self.facts.get(node_id)

    def start(self, key: str, node_id: int, role: str = "coder") -> None:
        self.pending.append(
            LlmCallStarted(at=self.clock, call_key=key, role=role, provider="openai", model="gpt-4.1", node_id=node_id)
        )

    def text(self, key: str, *pieces: str, retry: bool = False) -> None:
        if retry:
            self.pending.append(LlmText(call_key=key, text="", retry=True))
        self.pending.extend(LlmText(call_key=key, text=piece) for piece in pieces)

    def end(self, key: str, ended: LlmCall) -> LlmCall:
        """The call is recorded (the store first), then its end is an event."""
        ended = ended.model_copy(update={"id": len(self.calls) + 1})
        self.calls.append(ended)
        self.totals = self.totals.plus(ended)
        self.pending.append(LlmCallEnded(at=self.clock, call_key=key, call=ended, totals=self.totals))
        return ended


def make_app(source: SyntheticSource | None = None, **settings: object) -> KernelForgeApp:
    return KernelForgeApp(source or AgentSource(), TuiSettings(**settings))  # type: ignore[arg-type]


async def pump(app: KernelForgeApp, pilot: Pilot[None]) -> None:
    await app.pump()
    await settle(app, pilot)


async def drawn(app: KernelForgeApp, pilot: Pilot[None], text: str) -> None:
    """Wait until the terminal shows `text`: a loaded machine may draw the streamed pane a frame later."""
    for _ in range(100):
        if text in screen_text(app):
            return
        await pilot.pause(0.02)
    raise AssertionError(f"{text!r} never drawn")


def streaming(app: KernelForgeApp) -> bool:
    stream, diff = app.query_one(StreamPane), app.query_one(DiffPane)
    assert stream.display != diff.display  # one of the two has the place
    return stream.display


# -- header -------------------------------------------------------------------------------------------


async def test_the_header_meters_cost_and_tokens_against_their_caps() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.pause()
        assert "$1.23/$5.00  45.6k/2.00M tok" in screen_text(app)
        source.end("k", call("coder", source.parent_id, cost_nanousd=80_000_000, input_tokens=3000, output_tokens=400))
        await pump(app, pilot)
        assert "$1.31/$5.00  49k/2.00M tok" in screen_text(app)  # the ended call's totals move the meters


async def test_no_meters_on_a_run_without_calls_or_caps() -> None:
    app = make_app(SyntheticSource(40))
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert " tok" not in text and "$" not in text


# -- streaming into the diff's place ------------------------------------------------------------------


async def test_a_coder_writing_for_the_selected_node_streams_into_the_diff() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        selected = app.selected
        assert selected is not None and not streaming(app)
        source.start("k1", selected)
        await pump(app, pilot)
        stream = app.query_one(StreamPane)
        assert streaming(app) and stream.key == "k1"
        text = screen_text(app)
        assert f"coder openai/gpt-4.1 writing for #{selected}" in text and stream.waiting_note in text
        source.text("k1", "```cuda\n__global__ void ", "softmax_rows(")
        await pump(app, pilot)
        text = screen_text(app)
        assert "__global__ void softmax_rows(" in text and stream.waiting_note not in text
        source.text("k1", "const float* x) {\n", "  float4 v;")
        await pump(app, pilot)
        assert stream.lines == ["```cuda", "__global__ void softmax_rows(const float* x) {", "  float4 v;"]
        source.text("k1", "```cuda\n// take two", retry=True)  # the attempt failed: its text goes
        await pump(app, pilot)
        assert stream.lines == ["```cuda", "// take two"] and "attempt 2" in screen_text(app)
        source.end("k1", call("coder", selected))
        await pump(app, pilot)
        assert not streaming(app) and stream.key is None
        assert f"Diff #{selected} vs parent" in screen_text(app)  # the diff is back


async def test_only_kernel_writers_for_the_selected_node_stream_unless_following() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        other = source.parent_id
        source.start("plan", app.selected or 0, role="planner")
        source.start("k2", other)
        source.text("k2", "__global__ void other()")
        await pump(app, pilot)
        assert not streaming(app)  # a planner writes no kernel; the coder writes for another node
        await pilot.press("w")
        await pump(app, pilot)
        assert streaming(app) and f"writing for #{other}" in screen_text(app)
        assert "streaming the latest kernel being written" in screen_text(app)
        await pilot.press("w")
        await pump(app, pilot)
        assert not streaming(app)


async def test_following_switches_to_the_next_kernel_being_written() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("w")
        source.start("k1", 3)
        source.text("k1", "first")
        await pump(app, pilot)
        assert app.query_one(StreamPane).key == "k1"
        source.start("k2", 5, role="debugger")
        await pump(app, pilot)
        assert app.query_one(StreamPane).key == "k2" and "debugger openai/gpt-4.1 writing for #5" in screen_text(app)
        source.end("k2", call("debugger", 5, outcome="cancelled"))
        await pump(app, pilot)
        assert app.query_one(StreamPane).key == "k1"  # back to the one still being written
        assert app.query_one(StreamPane).lines == ["first"]


# -- log, metrics ------------------------------------------------------------------------------------


async def test_each_ended_call_is_one_log_line_and_failures_are_warnings() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(200, 48)) as pilot:
        await pilot.pause()
        bad = call("coder", 7, outcome="error", error="openai: 429 rate limited, gave up after 4 attempts", attempts=4)
        source.end("e", bad)
        source.end("o", call("analyst", 7, model="gpt-4.1-mini"))
        await pump(app, pilot)
        lines = [line for line in app.state.logs if line.text.startswith(("coder", "analyst"))]
        assert [(line.level, line.node_id) for line in lines] == [("warning", 7), ("info", 7)]
        text = screen_text(app)
        assert (
            "#7 coder openai/gpt-4.1: 1,200 in + 300 out tokens, $0.0042, 3.2 s, 4 attempts, error: openai: 429" in text
        )
        assert "#7 analyst openai/gpt-4.1-mini: 1,200 in + 300 out tokens" in text


async def test_the_metrics_show_the_judges_score_and_the_repair_link() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        assert app.selected == source.best_id
        text = screen_text(app)
        assert "judge" in text and " 0.82" in text
        assert f"repair of #{source.facts[source.best_id].repair_of}" in text
        await pilot.press("up")
        await settle(app, pilot)
        assert " 0.82" not in screen_text(app)  # another node: no judge, no repair


# -- conversation -------------------------------------------------------------------------------------


async def open_conversation(app: KernelForgeApp, pilot: Pilot[None], key: str = "c") -> ConversationScreen:
    await pilot.press(key)
    await settle(app, pilot)
    screen = app.screen
    assert isinstance(screen, ConversationScreen)
    await screen.workers.wait_for_complete()
    await pilot.pause()
    return screen


async def test_the_conversation_shows_every_call_behind_the_node() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(160, 80)) as pilot:
        await settle(app, pilot)
        app.query_one(SearchTree).select_id(source.parent_id)  # the parent: every call worked on it
        await settle(app, pilot)
        assert app.selected == source.parent_id
        screen = await open_conversation(app, pilot)
        assert screen.node_id == source.parent_id and screen.calls is not None and len(screen.calls) == 4
        text = screen_text(app)
        assert f"Conversation · #{source.parent_id}" in text
        assert "4 calls · 5,820 tokens · $0.0100" in text
        assert "planner  openai/gpt-4.1  ok" in text
        assert f"worked on #{source.parent_id} · wrote #{source.best_id}" in text
        assert "tokens 1,200 in / 300 out  cost $0.0042  latency 3.25 s · first token 0.80 s · 1 attempt" in text
        assert "malformed" in text and "2 attempts" in text and "error: no ```cuda block in the reply" in text
        assert " system " in text and "You are the coder of a team" in text and " user " in text
        assert " reply " in text and "__global__ void softmax_rows" in text and "I would use float4 loads." in text
        assert f"not kept · sha256 {'a' * 64}" in text and f"not kept · sha256 {'b' * 64}" in text
        assert "the warp with shuffles" in text  # the long user message is wrapped, not cropped
        await pilot.press("c")  # the same key closes it
        await pilot.pause()
        assert not isinstance(app.screen, ConversationScreen)


async def test_the_conversation_follows_a_call_in_flight_to_its_end() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(160, 60)) as pilot:
        await settle(app, pilot)
        node = source.best_id
        screen = await open_conversation(app, pilot)
        assert screen.calls is not None and len(screen.calls) == 2  # the coder that wrote it, the judge
        source.start("d1", node, role="debugger")
        source.text("d1", "```cuda\n// fixing the ", "tail loop")
        await pump(app, pilot)
        await screen.workers.wait_for_complete()
        await pilot.pause()
        text = screen_text(app)
        assert "writing…" in text and "// fixing the tail loop" in text and "1 in flight" in text
        source.text("d1", "\n}")
        await pump(app, pilot)
        await screen.workers.wait_for_complete()
        source.end("d1", call("debugger", node, reply="```cuda\n// fixed\n```"))
        await pump(app, pilot)
        await screen.workers.wait_for_complete()
        await pilot.pause()
        text = screen_text(app)
        assert screen.calls is not None and len(screen.calls) == 3 and "writing…" not in text
        assert "debugger  openai/gpt-4.1  ok" in text and "// fixed" in text


async def test_a_node_without_calls_says_so_and_escape_closes() -> None:
    app = make_app(SyntheticSource(20))  # a source that keeps no LLM calls reads as a run without any
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await open_conversation(app, pilot)
        assert f"No LLM call wrote #{app.selected} or worked on it" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ConversationScreen)


async def test_the_conversation_key_is_remappable_and_needs_a_node() -> None:
    app = make_app(keymap={"conversation": "K"})
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("c")
        await pilot.pause()
        assert not isinstance(app.screen, ConversationScreen)
        await open_conversation(app, pilot, "K")
        app.pop_screen()
        app.selected = None
        assert app.check_action("conversation", ()) is None


def test_a_prompt_that_is_not_a_message_list_shows_as_it_is() -> None:
    assert prompt_messages('[{"role": "user", "content": "hi"}]') == [("user", "hi")]
    assert prompt_messages("plain text") == [("prompt", "plain text")]
    assert prompt_messages('{"role": "user"}') == [("prompt", '{"role": "user"}')]


# -- models ------------------------------------------------------------------------------------------


async def test_the_models_screen_compares_providers() -> None:
    source = AgentSource()
    app = make_app(source)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("M")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, ModelsScreen)
        await screen.workers.wait_for_complete()
        await pilot.pause()
        text = screen_text(app)
        best = source.best.speedup if source.best else 0
        assert "anthropic/claude-sonnet-4" in text and "openai/gpt-4.1" in text
        assert "67%" in text and f"{best:.2f}x" in text and "$0.31" in text and "$0.92" in text
        assert "$0.0417" in text and "$0.0900" in text  # per kernel: the coder's and debugger's calls only
        assert "all" in text and "35" in text and "$1.23" in text and "$0.0707" in text  # the totals row
        source.records = source.records[:1]
        source.end("x", call("coder", 3))
        await pump(app, pilot)
        await screen.workers.wait_for_complete()
        await pilot.pause()
        assert screen.records == source.records and "$0.92" not in screen_text(app)  # a call ended: read again
        await pilot.press("M")
        await pilot.pause()
        assert not isinstance(app.screen, ModelsScreen)


async def test_a_simulated_runs_models_screen_counts_no_kernel_correct() -> None:
    source = AgentSource()
    source.header = source.header.model_copy(update={"backend": SIMULATED})
    app = make_app(source)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("M")
        await settle(app, pilot)
        await app.screen.workers.wait_for_complete()
        await pilot.pause()
        text = screen_text(app)
    claude = next(line for line in text.splitlines() if "anthropic/claude-sonnet-4" in line)
    cells = claude.split("anthropic/claude-sonnet-4")[1].split()
    assert cells[:3] == ["14", "6", "-"] and "67%" not in text  # correct and success left empty
    assert "simulated run: no kernel is proven correct" in text


# -- snapshots ---------------------------------------------------------------------------------------


def snapshot_app() -> KernelForgeApp:
    return make_app(AgentSource(), theme="dark")


def test_header_with_meters_snapshot(snap_compare: Any) -> None:
    assert snap_compare(snapshot_app(), terminal_size=(160, 48))


def test_stream_in_place_of_the_diff_snapshot(snap_compare: Any) -> None:
    async def writing(pilot: Pilot[None]) -> None:
        app: Any = pilot.app
        await settle(app, pilot)
        source: AgentSource = app.source
        source.start("k1", app.selected)
        source.text("k1", REPLY[:60], REPLY[60:])
        await pump(app, pilot)
        await drawn(app, pilot, "// float4 loads")

    assert snap_compare(snapshot_app(), terminal_size=(160, 48), run_before=writing)


@pytest.mark.parametrize("size", [(100, 40), (80, 24)], ids=["100x40", "80x24"])
def test_conversation_screen_snapshot(snap_compare: Any, size: tuple[int, int]) -> None:
    async def conversation(pilot: Pilot[None]) -> None:
        app: Any = pilot.app
        await settle(app, pilot)
        await open_conversation(app, pilot)

    assert snap_compare(snapshot_app(), terminal_size=size, run_before=conversation)


def test_conversation_with_a_call_in_flight_snapshot(snap_compare: Any) -> None:
    """A reply in flight shows its last lines in a fixed height, below the node's ended calls."""

    async def in_flight(pilot: Pilot[None]) -> None:
        app: Any = pilot.app
        await settle(app, pilot)
        source: AgentSource = app.source
        source.start("d1", app.selected, role="debugger")
        source.text("d1", "".join(f"  line {i} of the fix;\n" for i in range(1, 25)), "  // still writ")
        await pump(app, pilot)
        await open_conversation(app, pilot)
        await pilot.press("end")
        await pilot.pause()

    assert snap_compare(snapshot_app(), terminal_size=(100, 30), run_before=in_flight)


def test_models_screen_snapshot(snap_compare: Any) -> None:
    async def models(pilot: Pilot[None]) -> None:
        app: Any = pilot.app
        await settle(app, pilot)
        await pilot.press("M")
        await settle(app, pilot)
        await app.screen.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(snapshot_app(), terminal_size=(120, 30), run_before=models)
