"""The Claude Code cases (evals/<id>/case.yaml): generated from evals.json, checked in, never
drifting, and loaded by the real `claude plugin eval` (no credentials: it stops at the
authentication step after the first case, after every case file has been read)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mbridge_perf.evals.export import TOOL_PREFIX, drift, expected_files
from mbridge_perf.evals.suite import all_cases

from helpers import REPO

CLAUDE = REPO / ".tools" / "node_modules" / ".bin" / "claude"


def test_checked_in_cases_match_evals_json() -> None:
    assert drift(REPO) == [], "run `mbridge-perf eval export` and commit evals/*/case.yaml"


def test_each_case_carries_the_question_and_one_grader_per_check() -> None:
    for case in all_cases(REPO):
        body = yaml.safe_load((REPO / "evals" / case.id / "case.yaml").read_text())
        assert body["name"] == case.id and body["schema_version"] == "1.0"
        assert body["execution"]["prompt"] == case.data["question"]
        graders = body["graders"]
        names = [g["name"] for g in graders]
        assert len(names) == len(set(names)), case.id
        llm = [g["criteria"] for g in graders if g["type"] == "llm"]
        assert llm == case.data["expected_behavior"]
        required = case.data.get("checks", {}).get("tool_calls", {}).get("required", [])
        used = [g["tool"] for g in graders if g["type"] == "tool_used" and g.get("min") == 1]
        assert used == [TOOL_PREFIX + t for t in required]
        for g in graders:
            if g["type"] == "regex":
                re.compile(g["pattern"])


def test_drift_is_detected(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    shutil.copytree(REPO / "skills", root / "skills")
    for path, text in expected_files(REPO).items():
        dest = root / path.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    assert drift(root) == []
    victim = next((root / "evals").glob("*/case.yaml"))
    victim.write_text(victim.read_text().replace("runs: 3", "runs: 4"))
    (root / "evals" / "stale-case").mkdir()
    (root / "evals" / "stale-case" / "case.yaml").write_text("name: stale\n")
    problems = drift(root)
    assert any("differs from evals.json" in p for p in problems)
    assert any("stale-case" in p for p in problems)


def _plugin_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           text=True, capture_output=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file() and not rel.startswith("evals/results/"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def test_claude_plugin_eval_loads_every_case(tmp_path: Path) -> None:
    if not CLAUDE.exists():
        if os.environ.get("MBRIDGE_PERF_REQUIRE_CLIS") == "1":
            pytest.fail(f"{CLAUDE} missing; scripts/run-tests installs it")
        pytest.skip("Claude Code CLI not installed (scripts/run-tests installs it into .tools)")
    plugin = _plugin_copy(tmp_path / "plugin")
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(tmp),
           "DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}
    r = subprocess.run([str(CLAUDE), "plugin", "eval", ".", "--trust-plugin", "--ablation",
                        "none", "--runs", "1"], cwd=plugin, env=env, text=True,
                       capture_output=True, timeout=300)
    out = r.stdout + r.stderr
    load_errors = [line for line in out.splitlines() if re.match(r"✗ \S+: ", line)]
    assert load_errors == [] and "Couldn't load" not in out, out[-3000:]
    missing = [c.id for c in all_cases(REPO) if c.id not in out]
    assert missing == [], out[-3000:]
    assert "authentication" in out or "Not logged in" in out, out[-3000:]
