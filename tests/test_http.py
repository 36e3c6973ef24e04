"""`mbridge-perf serve --http`: loopback by default, a bearer token for anything else, 401
without it, and no browser Origin but localhost. Real processes, real sockets."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
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
    port = free_port()
    proc = subprocess.Popen([tool("mbridge-perf"), "serve", "--http", "--port", str(port),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"server exited: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
