"""Grade a draft answer handed over as text (the grade_answer MCP tool): against one skill's
answer checklist, or against one evals.json case."""

from __future__ import annotations

from pathlib import Path

from mbridge_perf.evals.answer import AnswerError, parse_answer
from mbridge_perf.evals.grade import Grade, grade_case, grade_skill
from mbridge_perf.evals.suite import SuiteError, find_case
from mbridge_perf.skillpack.pack import PackError, get_skill


def grade_text(root: Path, answer: str, *, skill: str | None = None,
               case_id: str | None = None, tool_calls: list[str] | None = None) -> Grade:
    """Exactly one of ``skill`` / ``case_id``; raises SuiteError naming the argument."""
    if (skill is None) == (case_id is None):
        raise SuiteError("give exactly one of skill (grade against its answer checklist) or "
                         "case_id (grade against that evals.json case)")
    try:
        parsed = parse_answer(answer, tool_calls)
    except AnswerError as exc:
        raise SuiteError(f"answer: {exc}") from None
    if tool_calls is not None:
        parsed.tool_calls = [c.rsplit("__", 1)[-1] for c in tool_calls]
    if case_id is not None:
        case = find_case(root, case_id)
        return grade_case(case.data, case.skill.card, parsed, case.skill.folder_name)
    try:
        found = get_skill(root, str(skill))
    except PackError as exc:
        raise SuiteError(f"skill: {exc}") from None
    return grade_skill(found.card, parsed, found.folder_name)
