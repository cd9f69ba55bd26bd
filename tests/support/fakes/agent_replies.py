"""The agent team's replies as models write them, a responder that hands each request the reply scripted for the
prompt asking (the `[prompt planner.v1]` line heading its system message), and a sink that records calls.

Why by prompt: the team's calls run at once (a pool of first kernels, candidates coded side by side), so a FIFO
would hand replies out in whatever order the requests happen to arrive.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelforge_tui.vocabulary.llm import LlmCall, Role
from tests.support.fakes.llm_server import Reply, Seen

ROOT = Path(__file__).resolve().parents[3]
CARD_DIR = ROOT / "examples" / "cards" / "softmax_bf16_small"
KERNEL = (ROOT / "examples" / "kernels" / "softmax" / "block_row_bf16.cu").read_text()
"""A correct softmax kernel (one block per row) for the card above."""
PLAN: dict[str, Any] = {
    "entry": "softmax_block_row_bf16",
    "grid": ["rows"],
    "block": [128],
    "args": ["x", "y", "rows", "cols"],
}
PROMPT_ID = re.compile(r"^\[prompt ([a-z_]+)\.v[0-9]+\]")


def kernel(line: str = "Kept the row in registers and read x once.", source: str = KERNEL, plan: Any = PLAN) -> str:
    """A coder's reply: one line of prose, the CUDA block, the plan's JSON block."""
    return f"{line}\n\n```cuda\n{source}```\n\n```json\n{json.dumps(plan)}\n```\n"


def strategy(title: str, body: str = "Load 16 bytes per thread; reduce with warp shuffles.") -> str:
    return f"{title}\n{body}"


def verdict(score: float, critique: str) -> str:
    return json.dumps({"score": score, "critique": critique})


def streamed(text: str, delay_s: float = 0.0) -> Reply:
    """The text in a few chunks, `delay_s` apart."""
    size = max(1, len(text) // 4)
    return Reply(chunks=tuple(text[i : i + size] for i in range(0, len(text), size)), chunk_delay_s=delay_s)


def conversation(seen: Seen) -> list[tuple[str, str]]:
    """(role, content) of a request in either protocol, the system message first."""
    messages = [(m["role"], m["content"]) for m in seen.body["messages"]]
    return [("system", seen.body["system"]), *messages] if "system" in seen.body else messages


def text_of(seen: Seen) -> str:
    return "\n".join(content for _, content in conversation(seen))


def prompt_of(seen: Seen) -> str:
    match = PROMPT_ID.match(conversation(seen)[0][1])
    return match.group(1) if match else "?"


class Script:
    """A responder: replies by prompt ("planner", "coder", "first", ...), in order; `prompt@model` (the provider's
    model id) goes first where given. A request with no reply left gets a 400, which the client does not retry."""

    def __init__(self, replies: Mapping[str, Sequence[str | Reply]]) -> None:
        self._replies = {key: deque(items) for key, items in replies.items()}
        self.seen: list[tuple[str, Seen]] = []
        self._lock = threading.Lock()

    def __call__(self, seen: Seen) -> Reply:
        prompt, model = prompt_of(seen), seen.body["model"]
        with self._lock:
            self.seen.append((prompt, seen))
            for key in (f"{prompt}@{model}", prompt):
                if self._replies.get(key):
                    reply = self._replies[key].popleft()
                    return reply if isinstance(reply, Reply) else streamed(reply)
        return Reply(status=400, error=f"no scripted reply for {prompt} ({model})")

    def asked(self, prompt: str) -> list[Seen]:
        """The requests of one prompt, in the order they arrived."""
        return [seen for name, seen in self.seen if name == prompt]

    def left(self) -> dict[str, int]:
        """Scripted replies nobody asked for."""
        return {key: len(items) for key, items in self._replies.items() if items}


class RecordingSink:
    """Keeps every call, numbered from 1 as a store would."""

    def __init__(self) -> None:
        self.calls: list[LlmCall] = []

    def refused(self) -> str | None:
        return None

    def started(self, key: str, role: Role, provider: str, model: str, node_id: int | None) -> None:
        return None

    def text(self, key: str, text: str, retry: bool) -> None:
        return None

    def ended(self, key: str, call: LlmCall) -> LlmCall:
        recorded = call.model_copy(update={"id": len(self.calls) + 1})
        self.calls.append(recorded)
        return recorded

    def ids(self, role: Role) -> list[int]:
        return [c.id for c in self.calls if c.role == role and c.id is not None]
