"""`c`: the conversation behind the selected node, every call that wrote it or worked on it, oldest first.

The ended calls are read from the run's store (in a thread worker: a live run in this process, a run followed from
another process and a finished run alike); the calls in flight come from the app's view of the run, their reply
growing as it streams. The app asks for a new read when a call about this node ends.

The screen is opaque: a translucent one shows the main screen through it, and that background is drawn again
whenever a pane beneath changes (with a search running, several times a second).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Static
from textual.worker import get_current_worker

from kernelforge_tui.engine.view import LiveCall, money_text
from kernelforge_tui.tui.screens.closable import ClosableScreen
from kernelforge_tui.tui.widgets.llm_call import CallView
from kernelforge_tui.vocabulary.llm import LlmCall


class ConversationScreen(ClosableScreen):
    DEFAULT_CSS = """
    ConversationScreen { align: center middle; background: $surface; }
    ConversationScreen > Vertical { width: 100%; height: 100%; border: round $primary; background: $surface; }
    ConversationScreen #calls { height: 1fr; background: $surface; scrollbar-size-vertical: 1; }
    ConversationScreen #conversation-note { color: $text-muted; padding: 0 1; }
    ConversationScreen #conversation-empty { color: $text-muted; text-style: italic; padding: 1 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Close", id="conversation_close"),
        Binding("right_square_bracket", "next_call", "Next call", id="conversation_next"),
        Binding("left_square_bracket", "previous_call", "Previous call", id="conversation_previous"),
    ]

    class CallsRead(Message):
        def __init__(self, calls: list[LlmCall]) -> None:
            super().__init__()
            self.calls = calls

    def __init__(
        self,
        node_id: int,
        read: Callable[[], list[LlmCall]],
        live: list[LiveCall],
        streamed: bool = True,
        close_keys: str = "",
    ) -> None:
        super().__init__(close_keys)
        """The keys that opened the screen (the app's, as remapped) close it too."""
        self.node_id = node_id
        self._read_calls = read
        self._live = live
        self.streamed = streamed
        """Whether calls in flight stream their text to this process."""
        self.calls: list[LlmCall] | None = None
        """The ended calls as last read; None before the first read lands."""

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"Conversation · #{self.node_id}"
            box.border_subtitle = "esc closes · [ ] previous/next call"
            yield Static("reading the calls…", id="conversation-note")
            yield VerticalScroll(id="calls", can_focus=True)

    def on_mount(self) -> None:
        self.query_one("#calls").focus()
        self.reload()

    # -- reads ----------------------------------------------------------------------------------

    def reload(self, live: list[LiveCall] | None = None) -> None:
        """Read the node's ended calls again (a call about it ended), with its calls in flight now."""
        if live is not None:
            self._live = live
        self._read()

    @work(thread=True, exclusive=True, group="conversation", exit_on_error=False)
    def _read(self) -> None:
        calls = self._read_calls()
        if not get_current_worker().is_cancelled:
            self.post_message(self.CallsRead(calls))

    @on(CallsRead)
    def _show_calls(self, message: CallsRead) -> None:
        self.calls = message.calls
        self._redraw()

    def _redraw(self) -> None:
        """Rebuild the list of calls (one draw at a time: a newer one replaces one under way)."""
        self._rebuild()

    @work(exclusive=True, group="conversation-draw")
    async def _rebuild(self) -> None:
        box = self.query_one("#calls", VerticalScroll)
        ended = self.calls or []
        views: list[CallView] = [CallView(call, id=f"call-{call.id}" if call.id else None) for call in ended]
        views.extend(CallView(live, streamed=self.streamed, id=f"live-{live.key}") for live in self._live)
        await box.remove_children()
        if views:
            await box.mount_all(views)
        else:
            await box.mount(
                Static(
                    f"No LLM call wrote #{self.node_id} or worked on it (a template's node, or a run without agents).",
                    id="conversation-empty",
                )
            )
        self._summarise(ended)

    def _summarise(self, ended: list[LlmCall]) -> None:
        tokens = sum(c.input_tokens + c.output_tokens for c in ended)
        cost = sum(c.cost_nanousd for c in ended) / 1e9
        live = f", {len(self._live)} in flight" if self._live else ""
        text = f"{len(ended)} calls{live} · {tokens:,} tokens · {money_text(cost)}" if ended or live else ""
        self.query_one("#conversation-note", Static).update(text)

    def show_live(self, live: list[LiveCall]) -> None:
        """The node's calls in flight now: their replies so far, redrawn; new ones added, ended ones dropped."""
        before = {call.key for call in self._live}
        self._live = live
        if self.calls is None:
            return  # the first read draws them
        if {call.key for call in live} != before:
            self._redraw()
            return
        for call in live:
            for view in self.query(f"#live-{call.key}").results(CallView):
                view.show(call)

    # -- keys -----------------------------------------------------------------------------------

    def _views(self) -> list[CallView]:
        return list(self.query_one("#calls").query_children(CallView).results(CallView))

    def _scroll_to_call(self, step: int) -> None:
        box = self.query_one("#calls", VerticalScroll)
        views = self._views()
        if not views:
            return
        top = box.scroll_y
        offsets = [view.virtual_region.y for view in views]
        if step > 0:
            target = next((i for i, y in enumerate(offsets) if y > top), len(views) - 1)
        else:
            target = next((i for i in reversed(range(len(offsets))) if offsets[i] < top), 0)
        box.scroll_to(y=offsets[target], animate=False)

    def action_next_call(self) -> None:
        self._scroll_to_call(1)

    def action_previous_call(self) -> None:
        self._scroll_to_call(-1)
