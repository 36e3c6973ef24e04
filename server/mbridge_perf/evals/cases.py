"""The eval suite's contract types: a case (one entry of a skill's evals.json), the outcome of
grading one answer to it, a run's report, and the error a suite that cannot be read raises.
The suite runner and the tool grader both build on these, so neither imports the other's
types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mbridge_perf.evals.grade import Grade
from mbridge_perf.skillpack.pack import Skill


class SuiteError(ValueError):
    """The suite cannot be read; the message names the file and what to fix."""


@dataclass
class Case:
    skill: Skill
    data: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def positive(self) -> bool:
        return self.data.get("expected_skill") is not None


@dataclass
class Outcome:
    """One graded answer and whether the grader judged it as its recording says it should."""

    case: str
    skill: str
    answer: str
    verdict: str
    grade: Grade | None
    ok: bool
    note: str
    seconds: float = 0.0


@dataclass
class RunReport:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)
