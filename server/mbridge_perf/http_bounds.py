"""Bounds on what HTTP request bodies may hold, in front of the MCP app.

Sessions are bounded in server.py (count and idle lifetime); this bounds the bodies of the
requests in flight. The SDK buffers a POST body (up to 4 MiB) before it knows the session, with
no time limit, so without this a flood of connections that each send part of a large body and
then stall held 4 MiB apiece for ever: memory grew with the connection count. Here every body
has a deadline, and the bytes all bodies in flight hold together have a budget; when a new
request's body does not fit, the body that has been arriving the longest is dropped (its client
gets 408), so a flood of stalled bodies never locks a new client out. Only bytes of requests
already being served (the tool is running) are never dropped: past them a request gets 503.

Tool calls are bounded too: the SDK runs each synchronous tool in a worker thread, up to anyio's
default of 40 at once, and a tool may need a few hundred MB while it runs (12 concurrent
plan_parallelism calls at 720,720 GPUs took the server to 2.2 GB). At most
``HTTP_TOOL_THREADS`` run at once here; the rest wait their turn (memory for what they are
waiting with only), and at most ``HTTP_MAX_POSTS`` POST requests are in flight at all (503
past that, after dropping a stalled body if there is one).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread

HTTP_MAX_BODY_BYTES = 4 * 1024 * 1024  # the SDK's own limit for one request body
HTTP_MAX_HELD_BYTES = 64 * 1024 * 1024  # all bodies in flight together
HTTP_BODY_TIMEOUT_S = 30.0  # from the request's headers to its last body byte
HTTP_TOOL_THREADS = 4  # synchronous tool calls running at once
HTTP_MAX_POSTS = 256  # POST requests in flight (arriving, waiting or being served)

_NO_BODY = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
Message = dict[str, Any]


class _Reading:
    """A body still arriving: its bytes so far and the scope that drops it."""

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.size = 0
        self.dropped = False


class BodyBounds:
    """ASGI middleware: each POST body is read here under a deadline and a shared byte budget,
    then handed on whole; other requests (GET streams, DELETE) pass straight through."""

    def __init__(self, app: Any, *, max_body: int = HTTP_MAX_BODY_BYTES,
                 max_held: int = HTTP_MAX_HELD_BYTES, timeout_s: float = HTTP_BODY_TIMEOUT_S,
                 max_posts: int = HTTP_MAX_POSTS, tool_threads: int = HTTP_TOOL_THREADS
                 ) -> None:
        self.app, self.max_body, self.max_held, self.timeout_s = app, max_body, max_held, timeout_s
        self.max_posts, self.tool_threads = max_posts, tool_threads
        self.posts = 0  # POST requests in flight
        self.held = 0  # bytes of every body in flight (arriving or being served)
        self.reading: dict[int, _Reading] = {}  # in arrival order: the oldest first
        self._ids = itertools.count()

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Message]],
                       send: Any) -> None:
        if scope["type"] == "lifespan":  # the server's loop starts: bound its tool threads
            anyio.to_thread.current_default_thread_limiter().total_tokens = self.tool_threads
        if scope["type"] != "http" or scope.get("method", "GET") in _NO_BODY:
            await self.app(scope, receive, send)
            return
        if self.posts >= self.max_posts and not self._drop_oldest():
            await _reply(send, 503, f"the server is serving {self.max_posts} requests; retry "
                                    "shortly")
            return
        declared = dict(scope.get("headers", [])).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body:
            await _reply(send, 413, f"request body over {self.max_body} bytes")
            return
        key, reading = next(self._ids), _Reading()
        self.reading[key] = reading
        self.posts += 1
        try:
            body, problem = await self._read(reading, receive)
            self.reading.pop(key, None)
            if problem is not None:
                await _reply(send, *problem)
                return
            if body is None:  # the client went away
                return
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.posts -= 1
            self.reading.pop(key, None)
            self.held -= reading.size

    async def _read(self, reading: _Reading, receive: Callable[[], Awaitable[Message]]
                    ) -> tuple[bytes | None, tuple[int, str] | None]:
        """The whole body, or why not: (None, (status, text)); (None, None) on disconnect."""
        chunks: list[bytes] = []
        with reading.scope:
            reading.scope.deadline = anyio.current_time() + self.timeout_s
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None, None
                chunk = message.get("body", b"")
                if reading.size + len(chunk) > self.max_body:
                    return None, (413, f"request body over {self.max_body} bytes")
                if not self._make_room(reading, len(chunk)):
                    return None, (503, "the server holds as many request bodies as it may; "
                                       "retry shortly")
                reading.size += len(chunk)
                self.held += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks), None
        if reading.dropped:
            return None, (408, "request body dropped: it arrived too slowly while the server "
                               "needed the room for another request; send it again")
        return None, (408, f"request body not received within {self.timeout_s:g} s")

    def _drop_oldest(self) -> bool:
        """Drop the body that has been arriving the longest; False when none is arriving."""
        for other in self.reading.values():
            if not other.dropped:
                other.dropped = True
                other.scope.cancel()
                self.held -= other.size
                other.size = 0
                return True
        return False

    def _make_room(self, reading: _Reading, size: int) -> bool:
        """Fit ``size`` more bytes in the budget by dropping the bodies that have been arriving
        the longest (never ``reading`` itself, never a request being served)."""
        for other in list(self.reading.values()):
            if self.held + size <= self.max_held:
                break
            if other is reading or other.dropped or not other.size:
                continue
            other.dropped = True
            other.scope.cancel()
            self.held -= other.size
            other.size = 0
        return self.held + size <= self.max_held


def _replay(body: bytes, receive: Callable[[], Awaitable[Message]]
            ) -> Callable[[], Awaitable[Message]]:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _reply(send: Any, status: int, text: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": text.encode()})
