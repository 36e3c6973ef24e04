"""Both doors on the bad-input corpus (tests/bad_inputs.py), each process under a 2 GiB
address-space limit and every input under 20 s: no traceback, no hang, CLI exit codes only
0/1/2 with one error line, and over MCP only tool errors whose text after the SDK's prefix is
our message naming the problem. A planted `evil` profile in the working directory and the
injection strings must leave no `pwned` file behind."""

from __future__ import annotations

import re
import resource
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from bad_inputs import (
    ANSWER_TEXTS,
    CLI_ARGS,
    CONFIG_BYTES,
    CONFIG_TEXTS,
    FLAGS,
    OVERRIDES,
    TOOL_ARGS,
)

from helpers import REPO, tool, tool_env

LIMIT_AS = 2 << 30
TIMEOUT_S = 20
NOT_OURS = re.compile(r"Traceback|validation errors? for|errors\.pydantic\.dev|object at 0x|"
                      r"<class |^[A-Z]\w*(Error|Exception)\b")


def test_the_corpus_is_big_enough() -> None:
    total = (len(CONFIG_TEXTS) + len(CONFIG_BYTES) + len(OVERRIDES) + len(FLAGS)
             + len(TOOL_ARGS) + len(CLI_ARGS))
    assert total >= 40 and len(CONFIG_TEXTS) >= 30


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A project folder as a cloned repository might leave it: a planted `evil` profile."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "evil").write_text("executor: local\nsetup: [touch ./pwned]\n")
    (work / "evil.yaml").write_text("executor: local\nsetup: [touch ./pwned]\n")
    (tmp_path / "profiles").mkdir()
    return work


def _env(work: Path) -> dict[str, str]:
    """The run registry and profiles in the test's folder; the pack is this checkout (so the
    `eval` cases reach the grader, not a "cannot find the skill pack" line)."""
    return tool_env(MBRIDGE_PERF_REGISTRY=str(work.parent / "runs.sqlite3"),
                    MBRIDGE_PERF_PROFILES=str(work.parent / "profiles"),
                    MBRIDGE_PERF_PACK=str(REPO))


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))


def _cli(work: Path, name: str, args: list[str]) -> str | None:
    """Run one CLI call; None when it behaved, else what went wrong."""
    try:
        p = subprocess.run([tool("mbridge-perf"), *args], cwd=work, env=_env(work),
                           capture_output=True, text=True, timeout=TIMEOUT_S,
                           preexec_fn=_limit)
    except subprocess.TimeoutExpired:
        return f"{name}: no answer within {TIMEOUT_S} s"
    errors = [line for line in p.stderr.splitlines() if "error" in line.lower()]
    if "Traceback" in p.stderr or p.returncode not in (0, 1, 2):
        return f"{name}: exit {p.returncode}: {p.stderr[-600:]}"
    if p.returncode == 2 and len(errors) != 1:
        return f"{name}: exit 2 needs exactly one error line, got {p.stderr[-600:]!r}"
    return None


def _cli_cases(work: Path) -> list[tuple[str, list[str]]]:
    cases: list[tuple[str, list[str]]] = []
    for name, text in CONFIG_TEXTS.items():
        path = work / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        cases += [(f"validate {name}", ["validate", str(path)]),
                  (f"estimate {name}", ["estimate", str(path), "--gpu", "H100"])]
    for name, raw in CONFIG_BYTES.items():
        path = work / f"{name}.yaml"
        path.write_bytes(raw)
        cases += [(f"validate {name}", ["validate", str(path)]),
                  (f"estimate {name}", ["estimate", str(path)])]
    for name, items in OVERRIDES.items():
        sets = [w for item in items for w in ("--set", item)]
        cases.append((name, ["validate", "--preset", "llama3-8b", *sets]))
    for name, flags in FLAGS.items():
        cases.append((name, ["estimate", "--preset", "llama3-8b", "--", *flags]))
    for name, answer in ANSWER_TEXTS.items():
        path = work / f"{name}.md"
        path.write_text(answer, encoding="utf-8")
        cases.append((f"eval grade {name}", ["eval", "grade", "--skill",
                                             "nemo-mbridge-perf-memory-tuning", "--answer",
                                             str(path)]))
    cases += list(CLI_ARGS.items())
    cases.append(("cli-profile-cwd-file", ["bench", "submit", "--preset", "llama3-8b",
                                           "--profile", "evil", "--run"]))
    return cases


def test_cli_door_survives_the_corpus(workdir: Path) -> None:
    cases = _cli_cases(workdir)
    with ThreadPoolExecutor(max_workers=4) as pool:
        problems = [p for p in pool.map(lambda c: _cli(workdir, *c), cases) if p]
    assert not problems, "\n".join(problems)
    assert not list(workdir.parent.rglob("pwned*"))


# ------------------------------------------------------------------ MCP

def _mcp_calls() -> list[tuple[str, str, dict[str, Any]]]:
    calls: list[tuple[str, str, dict[str, Any]]] = []
    for name, text in CONFIG_TEXTS.items():
        for tool_name in ("validate_config", "estimate_memory"):
            calls.append((name, tool_name, {"config": {"bridge_config": text}}))
    for name, items in OVERRIDES.items():
        calls.append((name, "validate_config",
                      {"config": {"preset": "llama3-8b", "overrides": items}}))
    for name, flags in FLAGS.items():
        calls.append((name, "estimate_memory",
                      {"config": {"preset": "llama3-8b", "perf_flags": flags}}))
    calls += [(name, t, args) for name, (t, args) in TOOL_ARGS.items()]
    return calls


def _ours(name: str, tool_name: str, text: str) -> str | None:
    prefix = f"Error executing tool {tool_name}: "
    if not text.startswith(prefix):
        return f"{name}: {tool_name} error without our message: {text[:300]!r}"
    rest = text[len(prefix):]
    if not rest.strip() or NOT_OURS.search(rest) or ": " not in rest[:160]:
        return f"{name}: {tool_name} error is not ours / names nothing: {rest[:300]!r}"
    return None


@pytest.mark.anyio
async def test_mcp_door_survives_the_corpus(workdir: Path) -> None:
    script = f"ulimit -v {LIMIT_AS // 1024} && exec {tool('mbridge-perf')} serve"
    params = StdioServerParameters(command="sh", args=["-c", script], cwd=str(workdir),
                                   env=_env(workdir))
    problems = []
    async with Client(params) as client:
        for name, tool_name, args in _mcp_calls():
            try:
                with anyio.fail_after(TIMEOUT_S):
                    r = await client.call_tool(tool_name, args)
            except TimeoutError:
                problems.append(f"{name}: {tool_name}: no answer within {TIMEOUT_S} s")
                break
            if r.is_error:
                problem = _ours(name, tool_name, r.content[0].text if r.content else "")
                if problem:
                    problems.append(problem)
        alive = {t.name for t in (await client.list_tools()).tools}
    assert not problems, "\n".join(problems)
    assert "validate_config" in alive
    assert not list(workdir.parent.rglob("pwned*"))
