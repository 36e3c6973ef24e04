"""Our own tools graded like any answer: each case with a config / log runs its tool, and the
tool's answer_markdown must pass the case; grade_answer over MCP."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client

from mbridge_perf.evals.suite import all_cases
from mbridge_perf.evals.tools import tool_outcome
from mbridge_perf.server import build_server

from helpers import REPO

TOOL_CASES = [c for c in all_cases(REPO) if "tool" in c.data]


def test_every_skill_grades_one_of_our_tools() -> None:
    assert {c.skill.folder_name for c in TOOL_CASES} == {
        c.skill.folder_name for c in all_cases(REPO)}


@pytest.mark.parametrize("case", TOOL_CASES, ids=[c.id for c in TOOL_CASES])
def test_tool_answer_markdown_passes_its_case(case: Any) -> None:
    outcome = tool_outcome(case, REPO)
    assert outcome is not None
    if outcome.note.startswith("unscored"):
        pytest.skip(outcome.note)  # the tool is not in this build yet; reported, never faked
    assert outcome.grade is not None, outcome.note
    assert outcome.ok, outcome.note
    assert outcome.grade.summary.failed == 0, [
        (e.text, e.evidence) for e in outcome.grade.expectations if not e.passed]


@pytest.fixture
async def client() -> Any:
    async with Client(build_server(REPO)) as c:
        yield c


pytestmark = pytest.mark.anyio


async def test_grade_answer_over_mcp(client: Client) -> None:
    draft = ("1. Raise TP to 8 (tensor_model_parallel_size=8).\n"
             "2. Then export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.\n")
    r = await client.call_tool("grade_answer", {
        "answer": draft, "case_id": "memory-tuning-positive-fragmentation-first-fix",
        "tool_calls": ["mcp__mbridge__estimate_memory"]})
    assert not r.is_error
    out = r.structured_content
    assert out["passed"] is False
    assert "must not recommend 'TP=8'" in out["failed_critical"]
    r = await client.call_tool("grade_answer", {"answer": draft, "skill": "nope"})
    assert r.is_error and "nope" in r.content[0].text
    r = await client.call_tool("grade_answer", {"answer": draft})
    assert r.is_error and "exactly one of skill" in r.content[0].text


async def test_estimate_memory_returns_answer_markdown(client: Client) -> None:
    cfg = {"preset": "llama3-70b", "bridge_config": (
        REPO / "examples" / "llama3_70b_sft_h100.yaml").read_text()}
    r = await client.call_tool("estimate_memory", {"config": cfg})
    assert not r.is_error
    md = r.structured_content["answer_markdown"]
    assert "most loaded stage is stage 0" in md
    assert md.index("expandable_segments") < md.index("recompute_modules=[layernorm]")


def test_a_tool_not_in_the_build_is_reported_unscored_not_faked(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from mbridge_perf.evals import tools
    from mbridge_perf.evals.cases import RunReport
    from mbridge_perf.evals.report import junit, table

    def missing(*_: Any) -> Any:
        raise ImportError("No module named 'mbridge_perf.advise.parallelism'")

    monkeypatch.setitem(tools.TOOLS, "plan_parallelism", missing)
    case = next(c for c in TOOL_CASES if c.data["tool"] == "plan_parallelism")
    outcome = tool_outcome(case, REPO)
    assert outcome is not None and outcome.grade is None and outcome.ok
    assert outcome.note.startswith("unscored: plan_parallelism is not available")
    report = RunReport(outcomes=[outcome])
    assert f"UNSCORED {case.id}/tool:plan_parallelism" in table(report)
    junit(report, tmp_path / "j.xml")
    assert "<skipped" in (tmp_path / "j.xml").read_text()
