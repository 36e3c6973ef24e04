"""Grade one answer against one case (its ``checks`` plus the skill's answer checklist) or
against a skill's checklist alone; the result has the skill-creator grading.json shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from mbridge_perf.evals import checks as ck
from mbridge_perf.evals.answer import Answer
from mbridge_perf.evals.checks import Expectation

PASS_THRESHOLD = 0.8
SKILL_PREFIX = "nemo-mbridge-perf-"


class GradedExpectation(BaseModel):
    text: str = Field(description="what the answer must do")
    passed: bool
    evidence: str = Field(description="the answer span (or JSON value) it was judged on")
    check: str = Field(description="kind of check, as named in checks.critical")
    critical: bool = Field(description="a failure fails the answer whatever else passes")
    counted: bool = Field(default=True, description="part of the verdict; false: reported for "
                                                    "the reader only (a skill-checklist step "
                                                    "the answer leaves out)")


class Summary(BaseModel):
    passed: int
    failed: int
    total: int
    pass_rate: float


class Grade(BaseModel):
    """The verdict on one answer."""

    target: str = Field(description="case id, or skill:<name> for a checklist-only grade")
    passed: bool = Field(description="no critical expectation failed and the pass rate is at "
                                     f"least {PASS_THRESHOLD:.0%}")
    expectations: list[GradedExpectation]
    summary: Summary
    failed_critical: list[str] = Field(description="texts of the critical expectations that "
                                                   "failed")

    def grading_json(self) -> dict[str, Any]:
        """The skill-creator grading.json: expectations[{text, passed, evidence}], summary."""
        return {"expectations": [{"text": e.text, "passed": e.passed, "evidence": e.evidence}
                                 for e in self.expectations],
                "summary": self.summary.model_dump(),
                "target": self.target, "passed": self.passed,
                "failed_critical": self.failed_critical}


def _vocab(checks: dict[str, Any], items: list[dict[str, Any]]) -> list[str]:
    terms = list(checks.get("first_recommendation_in", []))
    terms += [t for pair in checks.get("order", []) for t in pair]
    terms += checks.get("must_not_recommend", [])
    terms += [t for i in items if i.get("kind", "recommend") == "recommend" for t in i["match"]]
    return terms


def _case_expectations(case: dict[str, Any], card: dict[str, Any] | None, answer: Answer,
                       skill: str) -> list[Expectation]:
    c = case.get("checks", {})
    by_id = {i["id"]: i for i in (card or {}).get("answer_checklist", [])}
    items = [by_id[i] for i in c.get("checklist", []) if i in by_id]
    out: list[Expectation] = []
    if case.get("expected_skill") is None:
        out.append(ck.no_skill_claim(answer, skill))
    out += ck.include_all(answer, c.get("must_include_all", []))
    out += ck.include_any(answer, c.get("must_include_any", []))
    if c.get("first_recommendation_in"):
        out.append(ck.first_recommendation(answer, c["first_recommendation_in"],
                                           _vocab(c, items)))
    out += ck.order(answer, c.get("order", []))
    out += ck.not_recommend(answer, c.get("must_not_recommend", []))
    out += ck.not_include(answer, c.get("must_not_include", []))
    out += [ck.numeric(answer, n) for n in c.get("numeric", [])]
    if "required_fields" in c:
        out += ck.required_fields(answer, c["required_fields"])
    if "tool_calls" in c:
        out += ck.tool_calls(answer, c["tool_calls"])
    out += ck.checklist(answer, items)
    if case.get("expected_skill") is not None and (card or {}).get("misconceptions"):
        out.append(ck.no_misconceptions(answer, card, _vocab(c, items), omissions=False))
    if c.get("valid_keys_only"):
        out.append(ck.valid_keys(answer))
    return out


def _verdict(target: str, exps: list[Expectation], critical: set[str],
             advisory: frozenset[str] = frozenset()) -> Grade:
    graded = [GradedExpectation(text=e.text, passed=e.passed, evidence=e.evidence,
                                check=e.check, counted=e.check not in advisory,
                                critical=e.check not in advisory and (
                                    e.critical or e.check in critical
                                    or e.check.split(".")[0] in critical))
              for e in exps]
    counted = [e for e in graded if e.counted]
    n_pass = sum(e.passed for e in counted)
    total = len(counted)
    rate = n_pass / total if total else 1.0
    failed_critical = [e.text for e in graded if e.critical and not e.passed]
    return Grade(target=target, passed=not failed_critical and rate >= PASS_THRESHOLD,
                 expectations=graded,
                 summary=Summary(passed=n_pass, failed=total - n_pass, total=total,
                                 pass_rate=round(rate, 4)),
                 failed_critical=failed_critical)


def grade_case(case: dict[str, Any], card: dict[str, Any] | None, answer: Answer,
               skill: str) -> Grade:
    """``skill`` is the skill whose evals.json holds the case (negative cases must not claim
    it); ``card`` is that skill's card (for the checklist items the case names)."""
    exps = _case_expectations(case, card, answer, skill)
    return _verdict(case["id"], exps, set(case.get("checks", {}).get("critical", [])))


def grade_skill(card: dict[str, Any], answer: Answer, skill: str) -> Grade:
    """Against the skill's answer checklist, for a question not in evals.json, which the grader
    does not see: the recommendations it makes in the card's order, only real knobs, none of
    the card's misconceptions. Which checklist steps the answer covers is reported but not
    judged: a correct answer to a narrow question, a diagnosis or a pushback rightly leaves most
    steps out, and the steps a whole answer must not skip are the card's ``omission``
    misconceptions."""
    items = card["answer_checklist"]
    exps = ck.checklist(answer, items, lenient_order=True)
    exps.append(ck.valid_keys(answer))
    if card.get("misconceptions"):
        exps.append(ck.no_misconceptions(answer, card, _vocab({}, items)))
    return _verdict(f"skill:{skill}", exps, {"checklist.order", "valid_keys_only"},
                    advisory=frozenset({"checklist"}))
