"""One install for skills and server: the Claude Code plugin and marketplace manifests, the MCP
registry entry, one version everywhere, and the launcher that builds the server's venv on first
start (real pip, real MCP handshake)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from mbridge_perf import __version__

from helpers import REPO

LAUNCHER = REPO / "scripts" / "launch_server.py"
PLUGIN_ROOT_VAR = "${CLAUDE_PLUGIN_ROOT}"


def _json(rel: str) -> Any:
    return json.loads((REPO / rel).read_text(encoding="utf-8"))


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


# ------------------------------------------------------------------ one version


def test_every_manifest_carries_the_package_version() -> None:
    version = _pyproject()["version"]
    server = _json("server.json")
    found = {
        "mbridge_perf.__version__": __version__,
        ".claude-plugin/plugin.json": _json(".claude-plugin/plugin.json")["version"],
        ".claude-plugin/marketplace.json": next(
            p for p in _json(".claude-plugin/marketplace.json")["plugins"]
            if p["name"] == "mbridge-perf")["version"],
        "server.json version": server["version"],
        "server.json packages[pypi].version": next(
            p for p in server["packages"] if p["registryType"] == "pypi")["version"],
        "card.yaml": yaml.safe_load((REPO / "card.yaml").read_text(encoding="utf-8"))["version"],
    }
    assert {k: v for k, v in found.items() if v != version} == {}, f"pyproject has {version}"


def test_changelog_names_the_current_version() -> None:
    assert _pyproject()["version"] in (REPO / "CHANGELOG.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------ manifests


def test_plugin_manifest_describes_the_package() -> None:
    plugin, project = _json(".claude-plugin/plugin.json"), _pyproject()
    assert plugin["name"] == project["name"] == "mbridge-perf"
    assert plugin["license"] == project["license"]
    assert plugin["description"] and plugin["author"]["name"]
    assert plugin["homepage"].startswith("https://") and plugin["repository"].startswith("https://")
    assert {"megatron", "mcp"} <= set(plugin["keywords"])


def test_marketplace_lists_the_plugin_at_the_repository_root() -> None:
    market = _json(".claude-plugin/marketplace.json")
    assert market["owner"]["name"] and market["description"]
    (entry,) = market["plugins"]
    assert (entry["name"], entry["source"]) == ("mbridge-perf", "./")


def test_mcp_json_starts_the_launcher_from_the_plugin_root() -> None:
    (name, server), = _json(".mcp.json")["mcpServers"].items()
    assert name == "mbridge"  # tools stay mcp__mbridge__<tool>, as the skills and evals name them
    assert server["command"] == "python3"
    # isolated: no PYTHON* variables, no site-packages; the launcher needs only the stdlib
    assert server["args"] == ["-I", "-S", f"{PLUGIN_ROOT_VAR}/scripts/launch_server.py"]
    assert LAUNCHER.is_file()


def test_session_start_hook_only_prepares_the_venv() -> None:
    (entry,) = _json("hooks/hooks.json")["hooks"]["SessionStart"]
    (hook,) = entry["hooks"]
    launcher = f'"{PLUGIN_ROOT_VAR}/scripts/launch_server.py"'
    assert hook["command"] == f"python3 -I -S {launcher} --prepare"


def test_server_json_follows_the_registry_schema() -> None:
    """Registry schema 2025-12-11: reverse-DNS name with one slash, description <= 100 chars,
    a pinned PyPI package whose name is ours, stdio transport, started with `serve`."""
    server = _json("server.json")
    assert server["$schema"].endswith("/schemas/2025-12-11/server.schema.json")
    assert re.fullmatch(r"io\.github\.[A-Za-z0-9-]+/mbridge-perf", server["name"])
    assert 1 <= len(server["description"]) <= 100
    org = server["name"].split("/")[0].removeprefix("io.github.")
    repo_url = f"https://github.com/{org}/mbridge-perf"
    assert server["repository"] == {"url": repo_url, "source": "github"}
    assert _json(".claude-plugin/plugin.json")["repository"] == repo_url
    (pkg,) = server["packages"]
    assert (pkg["registryType"], pkg["identifier"]) == ("pypi", _pyproject()["name"])
    assert pkg["transport"] == {"type": "stdio"}
    assert [a["value"] for a in pkg["packageArguments"]] == ["serve"]


def test_readme_carries_the_registry_marker() -> None:
    """The registry checks PyPI ownership by finding `mcp-name: <name>` in the package README."""
    name = _json("server.json")["name"]
    assert f"mcp-name: {name}" in (REPO / "README.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------ launcher

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "launcher-test", "version": "0"}}}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def launcher_env(data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLAUDE_PLUGIN_", "MBRIDGE_PERF_", "VIRTUAL_ENV"))}
    env.update(MBRIDGE_PERF_DATA=str(data), **extra)
    return env


def plugin_snapshot(tmp_path: Path) -> Path:
    """A copy of what the launcher installs from (package, skill pack, build files): the install
    is keyed on their content, so edits others make in a shared checkout meanwhile must not
    count as a new version between the cold and the warm start."""
    import shutil

    root = tmp_path / "plugin"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("server", "skills"):
        shutil.copytree(REPO / name, root / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "card.yaml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, root / name)
    (root / "scripts").mkdir()
    shutil.copy2(LAUNCHER, root / "scripts" / "launch_server.py")
    return root


def tools_via_launcher(env: dict[str, str], timeout: float, launcher: Path = LAUNCHER
                       ) -> tuple[list[str], str, float]:
    """Start the launcher like a client does; return (tool names, stderr, seconds to tools/list).
    stdout must carry JSON-RPC only."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(launcher)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdin and proc.stdout and proc.stderr
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        for msg in (INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}, LIST):
            proc.stdin.write(json.dumps(msg) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            reply = json.loads(line)  # anything else on stdout breaks the protocol
            if reply.get("id") == 2:
                elapsed = time.perf_counter() - start
                proc.kill()
                return [t["name"] for t in reply["result"]["tools"]], proc.stderr.read(), elapsed
        pytest.fail(f"no tools/list reply; stderr: {proc.stderr.read()[-2000:]}")
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()


def test_launcher_installs_once_then_starts_at_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    launcher = plugin_snapshot(tmp_path) / "scripts" / "launch_server.py"
    tools, err, cold = tools_via_launcher(launcher_env(data), timeout=600, launcher=launcher)
    assert "validate_config" in tools and "estimate_memory" in tools
    assert "first start: installing the server" in err and "installed in" in err
    assert (data / "venv" / ".mbridge-perf-install").is_file()
    assert "Successfully installed" in (data / "install.log").read_text()

    tools2, err2, warm = tools_via_launcher(launcher_env(data), timeout=120, launcher=launcher)
    assert tools2 == tools
    assert err2.strip() == "", f"a warm start must not install or talk: {err2!r}"
    assert warm < cold


def test_broken_install_is_one_clear_message_not_a_hang(tmp_path: Path) -> None:
    empty = tmp_path / "no-packages"
    empty.mkdir()
    data = tmp_path / "data"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(LAUNCHER)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL,
                          env=launcher_env(data, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(empty)))
    assert proc.returncode == 1
    assert proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("mbridge-perf: error: pip install failed")
    assert str(data / "install.log") in errors[0]
    assert not (data / "venv" / ".mbridge-perf-install").exists()  # the next start retries
    assert time.perf_counter() - start < 240


def test_launcher_refuses_an_old_python_with_one_line() -> None:
    code = ("import runpy, sys; sys.version_info = (3, 9, 0); sys.argv = ['x', '--prepare'];"
            f"runpy.run_path({str(LAUNCHER)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("mbridge-perf: error: Python 3.11 or newer is needed")


# ------------------------------------------------------------------ the launcher's install step
# (issue 23): a stand-in plugin root and venv whose `python -m pip` is a shell script, so the
# launcher's own logic — the install key, the deadline, the timeout variable — runs for real
# without PyPI.

STUB_PYTHON = """#!/bin/bash
here="$(cd "$(dirname "$0")" && pwd)"
echo "$*" >> "$here/../calls.log"
if [ -n "${STUB_HANG:-}" ]; then  # a pip that hangs without printing, with a helper of its own
  sleep 300 & echo $! > "$here/../helper.pid"
  sleep 300
fi
printf '#!/bin/sh\\necho mbridge-perf 0.0\\n' > "$here/mbridge-perf"
chmod +x "$here/mbridge-perf"
echo "Successfully installed mbridge-perf-0.0"
"""


def stub_plugin(tmp_path: Path) -> tuple[Path, Path]:
    """(plugin root with a copy of the launcher and a small package tree, data folder with a
    venv whose python is STUB_PYTHON)."""
    root = tmp_path / "plugin"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "launch_server.py").write_bytes(LAUNCHER.read_bytes())
    for name in ("pyproject.toml", "setup.py", "card.yaml"):
        (root / name).write_bytes((REPO / name).read_bytes())
    (root / "server" / "pkg").mkdir(parents=True)
    (root / "server" / "pkg" / "mod.py").write_text("VALUE = 1\n")
    data = tmp_path / "data"
    (data / "venv" / "bin").mkdir(parents=True)
    python = data / "venv" / "bin" / "python"
    python.write_text(STUB_PYTHON)
    python.chmod(0o755)
    return root, data


def prepare(root: Path, data: Path, timeout: float = 60, **extra: str
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", str(root / "scripts" / "launch_server.py"),
                           "--prepare"], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=launcher_env(data, **extra))


def pip_calls(data: Path) -> int:
    log = data / "venv" / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_source_change_reinstalls_and_nothing_else_does(tmp_path: Path) -> None:
    root, data = stub_plugin(tmp_path)
    first = prepare(root, data)
    assert first.returncode == 0, first.stderr
    assert pip_calls(data) == 1 and "installing the server" in first.stderr
    warm = prepare(root, data)
    assert (warm.returncode, warm.stderr, pip_calls(data)) == (0, "", 1)
    cache = root / "server" / "pkg" / "__pycache__"
    cache.mkdir()
    (cache / "mod.cpython-311.pyc").write_bytes(b"\0" * 16)  # bytecode is not source
    assert prepare(root, data).stderr == "" and pip_calls(data) == 1
    (root / "server" / "pkg" / "mod.py").write_text("VALUE = 2\n")  # what a `git pull` does
    pulled = prepare(root, data)
    assert pulled.returncode == 0 and "installing the server" in pulled.stderr
    assert pip_calls(data) == 2
    (root / "server" / "pkg" / "new.py").write_text("")  # a new module too
    assert prepare(root, data).returncode == 0 and pip_calls(data) == 3
    assert prepare(root, data).stderr == "" and pip_calls(data) == 3
    (root / "skills" / "s").mkdir(parents=True)  # the wheel bundles the skill pack
    (root / "skills" / "s" / "SKILL.md").write_text("x\n")
    assert prepare(root, data).returncode == 0 and pip_calls(data) == 4


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_silent_hung_install_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    import fcntl

    root, data = stub_plugin(tmp_path)
    start = time.perf_counter()
    proc = prepare(root, data, STUB_HANG="1", MBRIDGE_PERF_INSTALL_TIMEOUT="2")
    took = time.perf_counter() - start
    assert proc.returncode == 1 and took < 30, (took, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "took longer than 2 s" in errors[0], proc.stderr
    assert "MBRIDGE_PERF_INSTALL_TIMEOUT" in errors[0] and "Traceback" not in proc.stderr
    helper = int((data / "venv" / "helper.pid").read_text())
    deadline = time.monotonic() + 10
    while not _gone(helper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(helper), "the hung step's own child was left running"
    with open(data / "install.lock", "w") as handle:  # nobody holds the lock any more
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert not (data / "venv" / ".mbridge-perf-install").exists()  # the next start retries
    again = prepare(root, data)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf", "1e999", "15 min"])
def test_a_bad_install_timeout_is_one_line(tmp_path: Path, value: str) -> None:
    root, data = stub_plugin(tmp_path)
    proc = prepare(root, data, MBRIDGE_PERF_INSTALL_TIMEOUT=value)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"mbridge-perf: error: MBRIDGE_PERF_INSTALL_TIMEOUT={value!r}")
    assert pip_calls(data) == 0


def test_an_unwritable_data_folder_is_one_line(tmp_path: Path) -> None:
    root, data = stub_plugin(tmp_path)
    (data / "install.lock").mkdir()  # the lock cannot be opened for writing
    proc = prepare(root, data)
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"mbridge-perf: error: cannot write in the data folder {data}")
    assert "Traceback" not in proc.stderr
