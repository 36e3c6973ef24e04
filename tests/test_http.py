"""`mbridge-perf serve --http`: loopback by default, a bearer token for anything else, 401
without it, and no browser Origin but localhost. Real processes, real sockets."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from mcp import Client

from helpers import tool

INIT = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":'
        b'"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(*args: str, env: dict[str, str] | None = None) -> Iterator[int]:
    with serving_process(*args, env=env) as (port, _):
        yield port


@contextlib.contextmanager
def serving_process(*args: str, env: dict[str, str] | None = None
                    ) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The server on a free port; its log goes to a file (a pipe nobody reads would fill up
    and stall a server that logs every session)."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([tool("mbridge-perf"), "serve", "--http", "--port", str(port),
                                 *args], stdout=subprocess.DEVNULL, stderr=log,
                                env={**os.environ, **(env or {})})
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    log.seek(0)
                    pytest.fail(f"server exited: {log.read().decode()}")
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", port), 0.2):
                    break
                time.sleep(0.1)
            yield port, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def post(port: int, headers: dict[str, str]) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/mcp", data=INIT, method="POST",
        headers={"content-type": "application/json",
                 "accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.anyio
async def test_loopback_works_without_a_token() -> None:
    with serving() as port:
        async with Client(f"http://127.0.0.1:{port}/mcp") as c:
            names = [t.name for t in (await c.list_tools()).tools]
            r = await c.call_tool("validate_config", {"config": {"preset": "llama3-8b"}})
    assert "validate_config" in names and r.structured_content["ok"] is True


def test_non_loopback_bind_without_a_token_refuses_to_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MBRIDGE_PERF_TOKEN"}
    proc = subprocess.run([tool("mbridge-perf"), "serve", "--http", "--host", "0.0.0.0",
                           "--port", str(free_port())], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2
    assert "needs a bearer token" in proc.stderr and "--token" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_wrong_or_missing_token_gets_401_and_the_right_one_passes() -> None:
    with serving("--host", "0.0.0.0", env={"MBRIDGE_PERF_TOKEN": "s3cret"}) as port:
        assert post(port, {}) == 401
        assert post(port, {"authorization": "Bearer wrong"}) == 401
        assert post(port, {"authorization": "Bearer s3cret"}) == 200


def test_token_from_the_command_line_also_guards_loopback() -> None:
    with serving("--token", "t0k") as port:
        assert post(port, {"authorization": "Bearer nope"}) == 401
        assert post(port, {"authorization": "Bearer t0k"}) == 200


def test_browser_origins_other_than_localhost_are_refused() -> None:
    with serving() as port:
        assert post(port, {"origin": "https://evil.example"}) == 403
        assert post(port, {"origin": f"http://localhost:{port}"}) == 200


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


@pytest.mark.anyio
async def test_a_flood_of_initialize_calls_never_locks_out_a_new_client() -> None:
    """2,000 sessions opened and left idle (issue 23): the count stays bounded, memory with it,
    and a new client is still served."""
    import http.client

    from mbridge_perf.server import HTTP_MAX_SESSIONS

    with serving_process() as (port, proc):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        statuses: dict[int, int] = {}
        sessions = set()
        for _ in range(2_000):
            conn.request("POST", "/mcp", body=INIT, headers={
                "content-type": "application/json",
                "accept": "application/json, text/event-stream"})
            resp = conn.getresponse()
            resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            sessions.add(resp.getheader("mcp-session-id"))
        conn.close()
        assert statuses == {200: 2_000} and len(sessions) == 2_000
        async with Client(f"http://127.0.0.1:{port}/mcp") as c:
            r = await c.call_tool("validate_config", {"config": {"preset": "llama3-8b"}})
        assert r.structured_content["ok"] is True
        rss = _rss_kib(proc.pid)
    assert rss < 250 * 1024, f"{rss} KiB after the flood"  # 478 MB before the bound
    assert 0 < HTTP_MAX_SESSIONS <= 1_000


H_JSON = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def _open_session(port: int) -> tuple[int, str | None]:
    """Open a session (initialize) and return the status and its id."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/mcp", body=INIT, headers=H_JSON)
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("mcp-session-id")
    finally:
        conn.close()


def _hold_stream(port: int, sid: str) -> socket.socket:
    """A GET SSE stream of session ``sid`` kept open (its status line read)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nmcp-session-id: {sid}\r\n"
                 "mcp-protocol-version: 2025-11-25\r\naccept: text/event-stream\r\n\r\n"
                 .encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    return sock


def _stall_body(port: int, sent: int) -> socket.socket:
    """A POST that declares a body just under the 4 MiB limit, sends ``sent`` bytes of it and
    stalls."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 "content-type: application/json\r\n"
                 "accept: application/json, text/event-stream\r\n"
                 "content-length: 4000000\r\n\r\n".encode() + b" " * sent)
    return sock


def _ended(sock: socket.socket, within: float = 0.05) -> bytes | None:
    """What the server sent before ending the response on ``sock`` (the last chunk sent, or
    the connection closed) within ``within`` seconds; None while it is still open."""
    deadline = time.monotonic() + within
    data = b""
    while True:
        sock.settimeout(max(0.01, min(0.2, deadline - time.monotonic())))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            chunk = None
        if chunk == b"":
            return data
        data += chunk or b""
        if data.endswith(b"0\r\n\r\n"):
            return data
        if time.monotonic() >= deadline:
            return None


@pytest.mark.anyio
@pytest.mark.parametrize("stalled", [0, 300], ids=["sse-streams", "sse-streams+stalled-bodies"])
async def test_a_flood_holding_streams_and_bodies_open_never_locks_out_a_new_client(
        stalled: int) -> None:
    """More sessions than the bound, each holding a GET SSE stream open so none is ever idle,
    then (variant) 300 POSTs each stalled after 1 MB of a 4 MB body (issue 23): every session
    opening is served, the evicted sessions' streams are closed, the oldest stalled bodies are
    dropped with 408, memory stays bounded and a new client is served - during the flood."""
    from mbridge_perf.http_bounds import HTTP_MAX_HELD_BYTES
    from mbridge_perf.server import HTTP_MAX_SESSIONS

    flood = HTTP_MAX_SESSIONS + 60
    with serving_process() as (port, proc):
        held: list[socket.socket] = []
        bodies: list[socket.socket] = []
        try:
            for i in range(flood):
                status, sid = _open_session(port)
                assert status == 200 and sid, f"session {i}: HTTP {status}"
                held.append(_hold_stream(port, sid))
            bodies = [_stall_body(port, 1 << 20) for _ in range(stalled)]
            async with Client(f"http://127.0.0.1:{port}/mcp") as c:
                r = await c.call_tool("validate_config", {"config": {"preset": "llama3-8b"}})
            assert r.structured_content["ok"] is True
            evicted = flood - HTTP_MAX_SESSIONS
            assert all(_ended(s, within=10) is not None for s in held[:evicted])
            assert _ended(held[-1], within=0.5) is None  # the newest sessions keep theirs
            answers = [_ended(s, within=0.2) for s in bodies]
            dropped = sum(a is not None and a.startswith(b"HTTP/1.1 408") for a in answers)
            assert dropped >= stalled - HTTP_MAX_HELD_BYTES // (1 << 20)
            rss = _rss_kib(proc.pid)
        finally:
            for s in held + bodies:
                s.close()
    assert rss < 300 * 1024, f"{rss} KiB with {HTTP_MAX_SESSIONS} sessions and stalled bodies"


def test_eviction_takes_the_longest_idle_session_then_the_longest_busy_one() -> None:
    from types import SimpleNamespace

    from mbridge_perf.server import HTTP_IDLE_TIMEOUT_S, _evict_one

    class Scope:
        def __init__(self, deadline: float) -> None:
            self.deadline, self.cancelled = deadline, False

        def cancel(self) -> None:
            self.cancelled = True

    def t(deadline: float, busy: int = 0, since: float = 0.0) -> SimpleNamespace:
        return SimpleNamespace(idle_scope=Scope(deadline), _requests_in_flight=busy,
                               last_request_at=since)

    sessions = {"busy-old": t(1.0, busy=1), "idle-old": t(5.0), "idle-new": t(9.0),
                "starting": SimpleNamespace(idle_scope=None, _requests_in_flight=0)}
    old = sessions["idle-old"]
    manager = SimpleNamespace(_session_owners={"idle-old": "u"})
    _evict_one(manager, sessions)
    assert set(sessions) == {"busy-old", "idle-new", "starting"} and old.idle_scope.cancelled
    assert manager._session_owners == {}
    # none idle: the busy session whose latest request started first goes, never a starting one
    only_busy = {"recent": t(1.0, busy=1, since=50.0), "stale": t(1.0, busy=2, since=10.0),
                 "starting": SimpleNamespace(idle_scope=None, _requests_in_flight=1)}
    stale = only_busy["stale"]
    _evict_one(manager, only_busy)
    assert set(only_busy) == {"recent", "starting"} and stale.idle_scope.cancelled
    only_starting = {"s": SimpleNamespace(idle_scope=None, _requests_in_flight=0)}
    _evict_one(manager, only_starting)
    assert set(only_starting) == {"s"}
    assert 0 < HTTP_IDLE_TIMEOUT_S <= 3600


@pytest.mark.anyio
async def test_body_bounds_deadline_size_and_budget() -> None:
    """The body bounds in process (small limits): a stalled body gets 408 at its deadline, an
    oversized one 413, a new body drops the oldest stalled one when the budget is full, and a
    budget held by requests being served gives 503 (never a drop)."""
    import anyio

    from mbridge_perf.http_bounds import BodyBounds

    served: list[bytes] = []
    release = anyio.Event()

    async def app(scope: dict, receive, send) -> None:
        served.append((await receive())["body"])
        if scope["path"] == "/hold":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    bounds = BodyBounds(app, max_body=100, max_held=150, timeout_s=0.5)

    async def call(path: str, parts: list[bytes], stall: bool = False) -> int:
        queue = list(parts)
        sent: list[int] = []

        async def receive() -> dict:
            if queue:
                return {"type": "http.request", "body": queue.pop(0),
                        "more_body": bool(queue) or stall}
            await anyio.sleep(60)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                sent.append(message["status"])

        await bounds({"type": "http", "method": "POST", "path": path, "headers": []},
                     receive, send)
        return sent[0]

    assert await call("/", [b"a" * 10, b"b" * 10]) == 200 and served[-1] == b"a" * 10 + b"b" * 10
    assert await call("/", [b"x" * 60, b"x" * 60]) == 413
    with anyio.fail_after(5):
        assert await call("/", [b"s" * 10], stall=True) == 408  # deadline
    results: dict[str, int] = {}

    async def run(name: str, path: str, parts: list[bytes], stall: bool = False) -> None:
        results[name] = await call(path, parts, stall)

    bounds.timeout_s = 30
    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "stalled", "/", [b"s" * 90], True)
        await anyio.sleep(0.05)
        tg.start_soon(run, "new", "/", [b"n" * 90])  # 180 > 150: the stalled body is dropped
        await anyio.sleep(0.05)
        assert results == {"stalled": 408, "new": 200} and bounds.held == 0
        tg.start_soon(run, "served", "/hold", [b"h" * 90])
        await anyio.sleep(0.05)
        tg.start_soon(run, "refused", "/", [b"r" * 90])  # the held bytes are being served
        await anyio.sleep(0.05)
        assert results["refused"] == 503 and bounds.held == 90
        release.set()
    assert results["served"] == 200 and bounds.held == 0 and not bounds.reading


IDLE_SERVER = """import sys
import mbridge_perf.server as s
s.HTTP_IDLE_TIMEOUT_S = 1.0
s.serve_http(s.build_server(), "127.0.0.1", int(sys.argv[1]), None)
"""


def test_an_idle_session_ends_at_its_idle_lifetime_over_real_http() -> None:
    """The idle lifetime through real HTTP (the server's constant lowered to 1 s in its own
    process): a session left idle answers 404 afterwards (the client starts a new one), one
    with a GET stream open is kept while the stream lasts, and a new client is served."""
    import sys

    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-c", IDLE_SERVER, str(port)],
                                stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", port), 0.2):
                    break
                time.sleep(0.1)
            idle = _open_session(port)[1]
            streaming = _open_session(port)[1]
            assert idle and streaming and _ping(port, idle) == 202
            stream = _hold_stream(port, streaming)
            time.sleep(3)
            assert _ping(port, idle) == 404
            assert _ended(stream, within=0.3) is None and _ping(port, streaming) == 202
            stream.close()
            assert _open_session(port)[0] == 200
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _ping(port: int, sid: str) -> int:
    """Status of a notification sent in session ``sid`` (202 accepted, 404 unknown)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/mcp", body=b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
                     headers={**H_JSON, "mcp-session-id": sid,
                              "mcp-protocol-version": "2025-11-25"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


PLAN_720720 = {"config": {"preset": "qwen3-235b-a22b"}, "num_gpus": 720_720, "gpu": "GB200",
               "seq_length": 1_441_440, "global_batch_size": 72_072_000}


@pytest.mark.anyio
async def test_concurrent_heavy_tool_calls_keep_memory_bounded() -> None:
    """Ten clients each running plan_parallelism at 720,720 GPUs at once (~200 MB apiece while it
    runs): the server runs a bounded number at a time, so its peak stays bounded (12 of them
    took it to 2.2 GB before), every call is answered and a new client is served meanwhile."""
    import anyio

    from mbridge_perf.http_bounds import HTTP_TOOL_THREADS

    async def plan(port: int, errors: list[bool]) -> None:
        async with Client(f"http://127.0.0.1:{port}/mcp") as c:
            errors.append((await c.call_tool("plan_parallelism", PLAN_720720)).is_error)

    with serving_process() as (port, proc):
        errors: list[bool] = []
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(plan, port, errors)
            await anyio.sleep(1)
            async with Client(f"http://127.0.0.1:{port}/mcp") as c:
                r = await c.call_tool("validate_config", {"config": {"preset": "llama3-8b"}})
            assert r.structured_content["ok"] is True
        peak = _peak_kib(proc.pid)
    assert errors == [False] * 10
    assert 1 <= HTTP_TOOL_THREADS <= 8
    assert peak < 1200 * 1024, f"peak {peak} KiB for 10 concurrent plans"


@pytest.mark.anyio
async def test_post_count_bound_drops_a_stalled_body_first_then_answers_503() -> None:
    import anyio

    from mbridge_perf.http_bounds import BodyBounds

    release = anyio.Event()

    async def app(scope: dict, receive, send) -> None:
        await receive()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    bounds = BodyBounds(app, max_posts=2, timeout_s=30)
    results: dict[str, int] = {}

    async def call(name: str, stall: bool) -> None:
        parts = [{"type": "http.request", "body": b"x", "more_body": stall}]

        async def receive() -> dict:
            if parts:
                return parts.pop()
            await anyio.sleep(60)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                results[name] = message["status"]

        await bounds({"type": "http", "method": "POST", "path": "/", "headers": []},
                     receive, send)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "served", False)
        tg.start_soon(call, "stalled", True)
        await anyio.sleep(0.05)
        tg.start_soon(call, "new", False)  # full: the stalled body makes way
        await anyio.sleep(0.05)
        assert results == {"stalled": 408}
        tg.start_soon(call, "refused", False)  # full of requests being served
        await anyio.sleep(0.05)
        assert results == {"stalled": 408, "refused": 503}
        release.set()
    assert results == {"stalled": 408, "refused": 503, "served": 200, "new": 200}
    assert bounds.posts == 0 and bounds.held == 0
