"""A real HTTP server on loopback that speaks both chat protocols (OpenAI chat completions, Anthropic messages),
streams server-sent events with chunked transfer encoding, and replays scripted replies, one per request.

Why a real server: the client's HTTP, streaming, retries and timeouts run for real; only the model is scripted.
A reply can fail (a status with a JSON error body and headers, padded to any size), drop the connection mid-stream,
end the stream without its terminal event, stall (idle), trickle chunks slowly, hold the stream open until the
client leaves, or stream text forever.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal


@dataclass
class Reply:
    status: int = 200
    chunks: tuple[str, ...] = ("Hello", ", ", "world")
    input_tokens: int = 11
    """Every prompt token, the cached ones included (Anthropic's `input_tokens` field gets those not cached)."""
    output_tokens: int = 5
    cache_write_tokens: int = 0
    """Anthropic's cache_creation_input_tokens (OpenAI reports no cache writes)."""
    cache_read_tokens: int = 0
    """Anthropic's cache_read_input_tokens; OpenAI's prompt_tokens_details.cached_tokens."""
    usage_every_chunk: bool = False
    """OpenAI: usage in every chunk from the first (vLLM's continuous_usage_stats), not only at the end."""
    refusal: bool = False
    """OpenAI: the chunks come as `refusal` deltas instead of content (a model that declines, structured outputs)."""
    stream_error: dict[str, Any] | None = None
    """With end="error": the error object the stream reports after the first text chunk."""
    finish: str | None = None
    """None: the protocol's own ("stop" or "end_turn")."""
    headers: dict[str, str] = field(default_factory=dict)
    error: str = "scripted error"
    """The error message in the JSON body of a reply whose status is not 200."""
    error_bytes: int = 0
    """Pad the error body with spaces (valid JSON still) to this many bytes, sent 64 KiB at a time."""
    end: Literal["done", "cut", "short", "no_terminal", "error", "stall", "hold", "endless"] = "done"
    """done: the whole stream; cut: close the socket after the first chunk, mid chunked body; short: a complete HTTP
    body that ends after the first chunk (no finish reason, no final usage); no_terminal: a complete HTTP body with
    the final usage and finish reason but without the protocol's terminal event; error: the protocol's error event
    (`stream_error`) after the first chunk, then the body ends; stall: sleep `stall_s` after the first chunk; hold:
    after the first chunk, wait until the client closes the connection; endless: after the first chunk, repeat the
    last text chunk until the client closes the connection."""
    stall_s: float = 0.0
    chunk_delay_s: float = 0.0
    delay_s: float = 0.0
    """Wait this long before answering at all (an error that takes time, a slow first byte)."""
    content_type: str = "text/event-stream"


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class _QuietServer(ThreadingHTTPServer):
    """Prints nothing when a request fails. Clients leave mid-reply on purpose here (timeouts, cancelled calls,
    a closed keep-alive connection reset at exit), and socketserver's traceback on stderr would land in the output a
    test reads: a CLI test once parsed it as part of its JSON reply."""

    def handle_error(self, request: object, client_address: object) -> None:
        return None


class LlmServer:
    """Start with `with LlmServer() as server:`; `server.script(...)` queues replies, the default is `Reply()`.
    A `responder` chooses each reply from its request instead (calls made at once then get deterministic replies,
    e.g. by the role that asks)."""

    def __init__(self, responder: Callable[[Seen], Reply] | None = None) -> None:
        self.responder = responder
        self.requests: list[Seen] = []
        self.active = 0
        self.max_active = 0
        self.client_left = threading.Event()
        """Set when the client closed the connection before the reply (held, endless or a padded error) ended."""
        self.first_chunk_sent = threading.Event()
        self.body_bytes_sent = 0
        """Bytes of the last padded error body or endless stream written before the client left."""
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def __enter__(self) -> LlmServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _take(self, seen: Seen) -> Reply:
        with self._lock:
            self.requests.append(seen)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            if self.responder is not None:
                return self.responder(seen)
            return self._replies.popleft() if self._replies else Reply()

    def _done(self) -> None:
        with self._lock:
            self.active -= 1


def _openai_events(reply: Reply, include_usage: bool) -> tuple[list[str], str]:
    """The chunks; the usage only when the request asked for it (`stream_options`), as OpenAI does."""
    usage: dict[str, Any] = {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }
    if reply.cache_read_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cache_read_tokens}

    def chunk(delta: dict[str, Any], finish: str | None = None, so_far: int | None = None) -> str:
        payload: dict[str, Any] = {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if reply.usage_every_chunk and so_far is not None:
            payload["usage"] = usage | {"completion_tokens": so_far, "total_tokens": reply.input_tokens + so_far}
        return f"data: {json.dumps(payload)}\n\n"

    field = "refusal" if reply.refusal else "content"
    events = [chunk({"role": "assistant", "content": ""}, so_far=0)]
    events += [chunk({field: text}, so_far=i + 1) for i, text in enumerate(reply.chunks)]
    events.append(chunk({}, reply.finish or "stop"))
    if include_usage:
        events.append(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n")
    return events, "data: [DONE]\n\n"


def _anthropic_events(reply: Reply) -> tuple[list[str], str]:
    def event(kind: str, payload: dict[str, Any]) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n"

    message = {
        "id": "msg_1",
        "role": "assistant",
        "content": [],
        "usage": {
            "input_tokens": reply.input_tokens - reply.cache_write_tokens - reply.cache_read_tokens,
            "cache_creation_input_tokens": reply.cache_write_tokens,
            "cache_read_input_tokens": reply.cache_read_tokens,
            "output_tokens": 1,
        },
    }
    events = [
        event("message_start", {"message": message}),
        event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        event("ping", {}),
    ]
    events += [
        event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": t}}) for t in reply.chunks
    ]
    events.append(event("content_block_stop", {"index": 0}))
    events.append(
        event(
            "message_delta",
            {"delta": {"stop_reason": reply.finish or "end_turn"}, "usage": {"output_tokens": reply.output_tokens}},
        )
    )
    return events, event("message_stop", {})


def _error_event(path: str, error: dict[str, Any]) -> str:
    if path.endswith("/chat/completions"):
        return f"data: {json.dumps({'error': error})}\n\n"
    return f"event: error\ndata: {json.dumps({'type': 'error', 'error': error})}\n\n"


def _handler(server: LlmServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the tests read `server.requests`."""

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = json.loads(self.rfile.read(length))
            reply = server._take(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            try:
                self._answer(reply, body)
            except OSError:
                self.close_connection = True
            finally:
                server._done()

        def _answer(self, reply: Reply, body: dict[str, Any]) -> None:
            time.sleep(reply.delay_s)
            if reply.status != 200:
                payload = json.dumps({"type": "error", "error": {"type": "scripted", "message": reply.error}}).encode()
                payload += b" " * max(0, reply.error_bytes - len(payload))
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self._until_client_leaves(payload[i : i + 65536] for i in range(0, len(payload), 65536))
                return
            if self.path.endswith("/chat/completions"):
                events, terminal = _openai_events(reply, (body.get("stream_options") or {}).get("include_usage", False))
            elif self.path.endswith("/v1/messages"):
                events, terminal = _anthropic_events(reply)
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-type", reply.content_type)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            first_text = 2 if self.path.endswith("/chat/completions") else 4
            for i, event in enumerate(events):
                self._chunk(event)
                if i + 1 == first_text:
                    server.first_chunk_sent.set()
                    if reply.end == "cut":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if reply.end in ("short", "error"):
                        if reply.end == "error":
                            self._chunk(_error_event(self.path, reply.stream_error or {}))
                        break
                    if reply.end == "stall":
                        time.sleep(reply.stall_s)
                    if reply.end == "hold":
                        self._hold()
                        return
                    if reply.end == "endless":
                        piece = events[-3].encode()  # the last text chunk, in both protocols
                        self._until_client_leaves(itertools.repeat(f"{len(piece):x}\r\n".encode() + piece + b"\r\n"))
                        return
                time.sleep(reply.chunk_delay_s)
            if reply.end in ("done", "stall"):
                self._chunk(terminal)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _until_client_leaves(self, pieces: Iterable[bytes]) -> None:
            """Write the pieces, counting the bytes, until they end or the client closes the connection."""
            server.body_bytes_sent = 0
            try:
                for piece in pieces:
                    self.wfile.write(piece)
                    server.body_bytes_sent += len(piece)
                self.wfile.flush()
            except OSError:
                server.client_left.set()
                self.close_connection = True

        def _hold(self) -> None:
            """Wait (up to 10 s) for the client to close the connection, and say when it did."""
            self.connection.settimeout(0.02)
            end = time.monotonic() + 10
            while time.monotonic() < end:
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            else:
                return
            server.client_left.set()
            self.close_connection = True

    return Handler
