"""The team's one way to ask a model: a role, a model by its config name, messages; back a parsed answer and the
call as recorded (tokens, cost, latency, outcome), with the reply streamed to whoever watches.

Why one place: every call, whichever role and provider, is recorded the same way (through a `CallSink`, which the
engine backs with the run's store and event bus), is costed from the same pricing table, and ends the same way
when the search cancels it. The API key never leaves the provider layer: the provider masks it out of replies and
errors where they enter, and the call recorded has it masked out of its prompt too (llm.masking).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import httpx

from kernelforge_tui.config import LlmSettings
from kernelforge_tui.llm.errors import FATAL, FatalLlmError, LlmError
from kernelforge_tui.llm.pricing import cost_nanousd
from kernelforge_tui.llm.provider import Provider
from kernelforge_tui.llm.types import ChatMessage, ChatReply, ChatRequest, Spend
from kernelforge_tui.vocabulary.llm import CallOutcome, LlmCall, Role

T = TypeVar("T")


class Malformed(Exception):
    """A reply the role cannot use (no code block, a plan that fails validation, no score); the text says why.
    Raised out of `LlmClient.ask` it carries the call as recorded and the reply, so the caller can link the call
    to what it becomes (a repair request, or a failed node that keeps the reply)."""

    call: LlmCall | None = None
    reply: str = ""


class Truncated(Malformed):
    """A reply cut off at `max_tokens` before it ended. The text names no fix: what the model is told is the
    caller's to choose (a larger budget is the operator's setting, not the model's)."""

    def __init__(self, max_tokens: int) -> None:
        super().__init__(f"the reply was cut off at max_tokens ({max_tokens}) before it ended")
        self.max_tokens = max_tokens


class CallSink(Protocol):
    """Where calls go: the engine records them in the run's store and shows them; `NullSink` keeps nothing."""

    def refused(self) -> str | None:
        """Why no call may go out now (a money or token budget is spent), or None."""
        ...

    def started(self, key: str, role: Role, provider: str, model: str, node_id: int | None) -> None: ...

    def text(self, key: str, text: str, retry: bool) -> None: ...

    def ended(self, key: str, call: LlmCall) -> LlmCall:
        """Record the call; the call as recorded (with its id)."""
        ...


class NullSink:
    """Records nothing (doctor's probes, `kernelforge new`)."""

    def refused(self) -> str | None:
        return None

    def started(self, key: str, role: Role, provider: str, model: str, node_id: int | None) -> None:
        return None

    def text(self, key: str, text: str, retry: bool) -> None:
        return None

    def ended(self, key: str, call: LlmCall) -> LlmCall:
        return call


@dataclass(frozen=True)
class Answer(Generic[T]):
    value: T
    call: LlmCall
    text: str


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode(errors="backslashreplace")).hexdigest()


class LlmClient:
    """The configured providers over one `httpx.AsyncClient`; `async with` opens and closes it."""

    def __init__(self, settings: LlmSettings, sink: CallSink | None = None) -> None:
        self.settings = settings
        self.sink: CallSink = sink or NullSink()
        self._http = httpx.AsyncClient(http2=False)
        self.providers = {p.name: Provider(p, self._http) for p in settings.providers}

    async def __aenter__(self) -> LlmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def ask(
        self,
        role: Role,
        model_name: str,
        messages: Sequence[ChatMessage],
        parse: Callable[[str], T],
        *,
        node_id: int | None = None,
        max_tokens: int | None = None,
    ) -> Answer[T]:
        """Ask `model_name` (a config name) in the given role. LlmError when the provider fails (of kind "refused"
        when the model refused the request; FatalLlmError instead when its key is refused or not set), Malformed
        when `parse` rejects the reply (or the reply was cut at max_tokens), CancelledError when cancelled: each is
        recorded first, with the tokens and cost of every attempt, as the provider reported them or estimated where
        it did not. A call the sink refuses (a budget is spent) never goes out: LlmError of kind "budget"."""
        model = self.settings.model(model_name)
        provider = self.providers[model.provider]
        request = ChatRequest(
            model=model.model, messages=tuple(messages), max_tokens=max_tokens or model.max_tokens, extra=model.extra
        )
        refused = self.sink.refused()
        if refused is not None:
            raise LlmError(
                provider.settings.name, "budget", refused, "raise the budget, or resume the run with a larger one"
            )
        prompt = provider.mask(json.dumps([m.model_dump() for m in messages], ensure_ascii=False))
        key = uuid.uuid4().hex
        self.sink.started(key, role, provider.settings.name, model.model, node_id)
        loop = asyncio.get_running_loop()
        start = loop.time()
        keep = self.settings.agents.record_text
        spend = Spend()

        def record(outcome: CallOutcome, reply: ChatReply | None, text: str = "", error: str = "") -> LlmCall:
            usage = spend.total()  # every attempt's, however the call ended
            call = LlmCall(
                node_id=node_id,
                role=role,
                provider=provider.settings.name,
                model=model.model,
                prompt=prompt if keep else None,
                prompt_sha256=sha256(prompt),
                reply=text if keep else None,
                reply_sha256=sha256(text),
                input_tokens=usage.input_tokens if usage else 0,
                output_tokens=usage.output_tokens if usage else 0,
                cache_write_tokens=usage.cache_write_tokens if usage else 0,
                cache_read_tokens=usage.cache_read_tokens if usage else 0,
                estimated=usage.estimated if usage else False,
                cost_nanousd=cost_nanousd(usage, self.settings.price(model)),
                latency_s=reply.latency_s if reply is not None else loop.time() - start,
                first_token_s=reply.first_token_s if reply is not None else None,
                attempts=reply.attempts if reply is not None else 1,
                outcome=outcome,
                error=error,
            )
            return self.sink.ended(key, call)

        try:
            reply = await provider.chat(request, lambda text, retry: self.sink.text(key, text, retry), spend)
        except LlmError as err:
            record("error", None, error=str(err))
            if err.kind in FATAL:
                raise FatalLlmError(err) from err
            raise
        except asyncio.CancelledError:
            record("cancelled", None, error="cancelled: the search paused or stopped")
            raise
        if reply.refused:
            problem = f"the model refused the request (finish reason {reply.finish_reason})"
            record("refused", reply, reply.text, problem)
            raise LlmError(
                provider.settings.name,
                "refused",
                problem,
                f"rephrase what the {role} is asked (the card's description, your hints), or give the role another "
                "model",
            )
        try:
            if reply.truncated:
                raise Truncated(request.max_tokens)
            value = parse(reply.text)
        except Malformed as bad:
            bad.call = record("malformed", reply, reply.text, str(bad))
            bad.reply = reply.text
            raise
        return Answer(value, record("ok", reply, reply.text), reply.text)
