"""The plugin as a new user meets it, with the real clients from npm (installed into .tools/ by
scripts/run-tests): Claude Code validates, installs from a fresh clone, reports the context cost
and connects the server; Codex registers the same launcher. Offline, scratch HOME, no login."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO

CLAUDE_CODE = "2.1.328"
CODEX = "0.171.0"
CLI_BIN = REPO / ".tools" / "node_modules" / ".bin"
REQUIRE_ENV = "MBRIDGE_PERF_REQUIRE_CLIS"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# on-invoke budget per skill and the always-on budget of the whole plugin, in tokens
ON_INVOKE_MAX = 4000
ALWAYS_ON_MAX = 900
# the first start installs from PyPI inside `claude mcp list`, which runs no SessionStart hook
COLD_MCP_TIMEOUT_MS = "180000"


def npm_cli(name: str, version: str) -> str:
    """The pinned CLI from .tools/ (or PATH); fail loudly where the test run installed them."""
    found = shutil.which(name, path=str(CLI_BIN)) or shutil.which(name)
    why = f"{name} {version} not found in {CLI_BIN} or on PATH"
    if found:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
        if version in out.stdout:
            return found
        why = f"{found} is {out.stdout.strip()!r}, not {version}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{why}; scripts/run-tests installs it into .tools/", pytrace=False)
    pytest.skip(f"{why} (scripts/run-tests installs it)")


def scratch_env(home: Path, **extra: str) -> dict[str, str]:
    """A new user's environment: empty HOME, no plugin or mbridge-perf settings inherited."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLAUDE", "ANTHROPIC_", "MBRIDGE_PERF_", "CODEX_", "MCP_",
                                "XDG_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1", DO_NOT_TRACK="1",
               **extra)
    return env


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{' '.join(cmd[1:])} exited {proc.returncode}:\n{out}"
    return out


@pytest.fixture(scope="module")
def claude() -> str:
    return npm_cli("claude", CLAUDE_CODE)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of the committed tree: no .venv, nothing built."""
    dest = tmp_path_factory.mktemp("clone") / "mbridge-perf"
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True, timeout=120)
    assert not (dest / ".venv").exists()
    return dest


def installed_home(claude: str, clone: Path, root: Path) -> tuple[Path, dict[str, str]]:
    home = root / "home"
    home.mkdir()
    env = scratch_env(home)
    out = run([claude, "plugin", "marketplace", "add", str(clone)], env, root)
    assert "Successfully added marketplace: mbridge-perf" in out, out
    out = run([claude, "plugin", "install", "mbridge-perf@mbridge-perf"], env, root)
    assert "Successfully installed plugin: mbridge-perf@mbridge-perf" in out, out
    return home, env


def plugin_data(home: Path) -> Path:
    return home / ".claude" / "plugins" / "data" / "mbridge-perf-mbridge-perf"


def test_plugin_validate_directory_profile_passes(claude: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    out = run([claude, "plugin", "validate", str(REPO), "--profile", "directory"],
              scratch_env(home), tmp_path)
    assert "✔ Validation passed" in out, out
    assert "✘" not in out and "error" not in out.lower(), out
    for part in ("mcpServers: mbridge stdio python3", "hooks: SessionStart"):
        assert part in out, out
    assert len(re.findall(r"skills: mbridge-perf:nemo-mbridge-perf-", out)) == 4, out


def test_details_show_the_inventory_and_the_context_budget(claude: str, clone: Path,
                                                           tmp_path: Path) -> None:
    _, env = installed_home(claude, clone, tmp_path)
    out = run([claude, "plugin", "details", "mbridge-perf"], env, tmp_path)
    assert re.search(r"Skills \(4\)", out) and re.search(r"MCP servers \(1\)\s+mbridge", out), out
    always_on = int(re.search(r"Always-on:\s+~(\d+) tok", out).group(1))
    assert always_on < ALWAYS_ON_MAX, out
    rows = re.findall(r"^\s+(nemo-mbridge-perf-[a-z-]+)\s+~([\d.]+)(k?)\s+~([\d.]+)(k?)\s*$",
                      out, re.MULTILINE)
    assert len(rows) == 4, out
    cost = {name: float(n) * (1000 if k else 1) for name, _, _, n, k in rows}
    assert {n: c for n, c in cost.items() if c > ON_INVOKE_MAX} == {}, out


def test_mcp_list_connects_the_plugin_server_from_a_clone_without_venv(
        claude: str, clone: Path, tmp_path: Path) -> None:
    home, env = installed_home(claude, clone, tmp_path)
    assert not (plugin_data(home) / "venv").exists()
    env["MCP_TIMEOUT"] = COLD_MCP_TIMEOUT_MS
    out = run([claude, "mcp", "list"], env, tmp_path, timeout=400)
    line = next((x for x in out.splitlines() if x.startswith("plugin:mbridge-perf:mbridge:")), "")
    assert "✔ Connected" in line, out
    assert f"{clone}/scripts/launch_server.py" in line
    assert (plugin_data(home) / "venv" / ".mbridge-perf-install").is_file()
    # warm: no install, the default start-up timeout is plenty
    env["MCP_TIMEOUT"] = "15000"
    assert "✔ Connected" in run([claude, "mcp", "list"], env, tmp_path)


def test_session_start_hook_prepares_the_venv_before_the_server_starts(
        claude: str, clone: Path, tmp_path: Path) -> None:
    """`claude -p` runs the SessionStart hooks before it stops at the missing login."""
    home, env = installed_home(claude, clone, tmp_path)
    proc = subprocess.run([claude, "-p", "hello"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert "Not logged in" in proc.stdout + proc.stderr  # no credentials here, by design
    assert (plugin_data(home) / "venv" / ".mbridge-perf-install").is_file()
    env["MCP_TIMEOUT"] = "15000"  # the hook did the install: a default timeout is enough
    assert "✔ Connected" in run([claude, "mcp", "list"], env, tmp_path)


def test_codex_registers_the_same_launcher(clone: Path, tmp_path: Path) -> None:
    codex = npm_cli("codex", CODEX)
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    env = scratch_env(home, CODEX_HOME=str(home / ".codex"))
    launcher = str(clone / "scripts" / "launch_server.py")
    run([codex, "mcp", "add", "mbridge", "--", "python3", launcher], env, tmp_path)
    out = run([codex, "mcp", "list"], env, tmp_path)
    row = next((x for x in out.splitlines() if x.split()[:1] == ["mbridge"]), "")
    assert "python3" in row and launcher in row and "enabled" in row, out
    assert launcher in (home / ".codex" / "config.toml").read_text()
