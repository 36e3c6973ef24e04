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


def test_eviction_takes_the_longest_idle_session_and_never_a_busy_one() -> None:
    from types import SimpleNamespace

    from mbridge_perf.server import HTTP_IDLE_TIMEOUT_S, _evict_idlest

    class Scope:
        def __init__(self, deadline: float) -> None:
            self.deadline, self.cancelled = deadline, False

        def cancel(self) -> None:
            self.cancelled = True

    def t(deadline: float, busy: int = 0) -> SimpleNamespace:
        return SimpleNamespace(idle_scope=Scope(deadline), _requests_in_flight=busy)

    sessions = {"busy-old": t(1.0, busy=1), "idle-old": t(5.0), "idle-new": t(9.0),
                "starting": SimpleNamespace(idle_scope=None, _requests_in_flight=0)}
    old = sessions["idle-old"]
    manager = SimpleNamespace(_session_owners={"idle-old": "u"})
    _evict_idlest(manager, sessions)
    assert set(sessions) == {"busy-old", "idle-new", "starting"} and old.idle_scope.cancelled
    assert manager._session_owners == {}
    only_busy = {"b": t(1.0, busy=2)}
    _evict_idlest(manager, only_busy)
    assert set(only_busy) == {"b"}
    assert 0 < HTTP_IDLE_TIMEOUT_S <= 3600
