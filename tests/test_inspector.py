"""The official MCP Inspector CLI against the installed server: schema portability lint with
--strict, and a tools/call that must come back with structured content."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import tool, tool_env

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def inspector(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # HOME is the temp dir: the Inspector keeps a catalog under ~/.mcp-inspector
    env = tool_env(DISABLE_TELEMETRY="1", HOME=str(cwd))
    return subprocess.run([tool("npx"), "-y", INSPECTOR, "--cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _own_stderr(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("npm ")]


def test_strict_tools_list_has_no_findings(tmp_path: Path) -> None:
    proc = inspector("--strict", "--format", "json", tool("mbridge-perf"), "serve",
                     "--method", "tools/list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _own_stderr(proc.stderr) == []
    names = [t["name"] for t in json.loads(proc.stdout)["result"]["tools"]]
    assert {"validate_config", "estimate_memory", "list_presets"} <= set(names)


def test_tools_call_validate_config_returns_structured_content(tmp_path: Path) -> None:
    config = {"preset": "llama3-70b", "overrides": ["model.tensor_model_parallel_size=3"]}
    proc = inspector("--format", "json", "-q", tool("mbridge-perf"), "serve", "--method",
                     "tools/call", "--tool-name", "validate_config", "--tool-arg",
                     "config=" + json.dumps(config), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["result"]
    structured = result["structuredContent"]
    assert structured["ok"] is False
    assert "tp.heads-divisible" in {f["rule_id"] for f in structured["findings"]}
    assert json.loads(result["content"][0]["text"]) == structured
