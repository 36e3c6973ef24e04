"""The recorded suite proves the grader: every golden answer passes, every known-bad answer
fails for the reason its front matter states, and a golden answer perturbed (first two
recommendations swapped, or a "do not" removed) flips to a fail."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from mbridge_perf.evals.answer import load_answer, parse_answer
from mbridge_perf.evals.cases import Case
from mbridge_perf.evals.grade import grade_case
from mbridge_perf.evals.suite import all_cases, answer_files, coverage, judge, run_suite

from helpers import REPO, SKILL_NAMES

CASES = {c.id: c for c in all_cases(REPO)}
ANSWERS = [(c, p) for c in CASES.values() for p in answer_files(REPO, c.id)]


def test_every_skill_has_eight_cases_two_of_them_negative() -> None:
    per_skill = Counter(c.skill.folder_name for c in CASES.values())
    negative = Counter(c.skill.folder_name for c in CASES.values() if not c.positive)
    assert {s: per_skill[s] >= 8 and negative[s] >= 2 for s in SKILL_NAMES} == \
        dict.fromkeys(SKILL_NAMES, True), (per_skill, negative)


def test_every_case_has_its_recorded_answers() -> None:
    assert coverage(REPO) == []


@pytest.mark.parametrize(("case", "path"), ANSWERS,
                         ids=[f"{c.id}/{p.stem}" for c, p in ANSWERS])
def test_recorded_answer_is_graded_as_recorded(case: Case, path: Path) -> None:
    outcome = judge(case, path)
    assert outcome.ok, outcome.note
    if outcome.verdict == "bad":
        reason = load_answer(path).meta["reason"]
        assert len(reason) > 20, "a known-bad answer states its mistake"


def test_the_whole_run_is_green_and_writes_grading_json(tmp_path: Path) -> None:
    report = run_suite(REPO, out=tmp_path)
    assert report.ok, [o.note for o in report.outcomes if not o.ok]
    golden = [o for o in report.outcomes if o.verdict == "golden"]
    bad = [o for o in report.outcomes if o.verdict == "bad"]
    assert len(golden) >= 32 and len(bad) >= 52
    sample = tmp_path / golden[0].case / "golden" / "grading.json"
    data = json.loads(sample.read_text())
    assert set(data["summary"]) == {"passed", "failed", "total", "pass_rate"}
    assert all(set(e) == {"text", "passed", "evidence"} for e in data["expectations"])
    assert all(e["evidence"] for e in data["expectations"])


_ITEM = re.compile(r"(?m)^(\d+)\. (.*)$")


def _swap_first_two(text: str) -> str:
    a, b = list(_ITEM.finditer(text))[:2]
    return (text[:a.start(2)] + b.group(2) + text[a.end(2):b.start(2)] + a.group(2)
            + text[b.end(2):])


def _drop_do_not(text: str) -> str:
    out = re.sub(r"\b[Dd]o not ", "", text, count=1)
    assert out != text
    return out


def _golden(case_id: str) -> str:
    return (REPO / "evals" / case_id / "answers" / "golden.md").read_text(encoding="utf-8")


def _regrade(case_id: str, text: str) -> list[str]:
    case = CASES[case_id]
    grade = grade_case(case.data, case.skill.card, parse_answer(text), case.skill.folder_name)
    assert not grade.passed, f"{case_id}: the perturbed golden answer still passes"
    return grade.failed_critical


@pytest.mark.parametrize("case_id", [
    "memory-tuning-positive-fragmentation-first-fix",
    "memory-tuning-positive-prelaunch-estimate",
    "activation-recompute-positive-borderline-oom-first-lever",
    "activation-recompute-positive-moonlight-core-attn-fused",
    "moe-optimization-workflow-positive-bring-up-order",
    "moe-optimization-workflow-positive-ab-one-variable",
])
def test_swapping_the_first_two_recommendations_flips_the_verdict(case_id: str) -> None:
    assert grade_case(CASES[case_id].data, CASES[case_id].skill.card,
                      parse_answer(_golden(case_id)), CASES[case_id].skill.folder_name).passed
    failed = _regrade(case_id, _swap_first_two(_golden(case_id)))
    assert any("first recommendation" in t or "before" in t for t in failed), failed


@pytest.mark.parametrize("case_id", [
    "memory-tuning-positive-vpp-misattribution",
    "memory-tuning-positive-prelaunch-estimate",
    "memory-tuning-positive-oom-log-triage",
    "activation-recompute-positive-borderline-oom-first-lever",
    "moe-long-context-positive-qwen3-235b-nvl72-cuda-graphs",
])
def test_removing_a_do_not_flips_the_verdict(case_id: str) -> None:
    failed = _regrade(case_id, _drop_do_not(_golden(case_id)))
    assert any("must not recommend" in t or "first recommendation" in t for t in failed), failed
