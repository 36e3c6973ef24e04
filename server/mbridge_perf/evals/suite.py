"""The eval suite on disk: cases from skills/*/evals/evals.json, recorded answers under
evals/<case-id>/answers/, and the run that proves the grader on them (golden answers pass,
known-bad answers fail for their stated reason)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mbridge_perf.evals.answer import AnswerError, load_answer
from mbridge_perf.evals.cases import Case, Outcome, RunReport, SuiteError
from mbridge_perf.evals.grade import grade_case
from mbridge_perf.evals.tools import tool_outcome
from mbridge_perf.skillpack.pack import PackError, list_skills

EVALS_DIR = "evals"
ANSWERS = "answers"
VERDICTS = ("golden", "bad")


def all_cases(root: Path, skill: str | None = None) -> list[Case]:
    skills = list_skills(root)
    if skill is not None:
        skills = [s for s in skills if s.folder_name == skill]
        if not skills:
            known = ", ".join(s.folder_name for s in list_skills(root))
            raise SuiteError(f"--skill {skill!r}: no such skill; known skills: {known}")
    try:
        return [Case(s, c) for s in skills for c in s.evals]
    except PackError as exc:
        raise SuiteError(str(exc)) from None


def find_case(root: Path, case_id: str) -> Case:
    for case in all_cases(root):
        if case.id == case_id:
            return case
    raise SuiteError(f"--case {case_id!r}: no case with that id in skills/*/evals/evals.json "
                     "(`mbridge-perf eval run` lists them)")


def _expected(meta: dict[str, Any], path: Path) -> tuple[str, str | None]:
    verdict = meta.get("verdict")
    if verdict not in VERDICTS:
        raise SuiteError(f"{path}: front matter verdict must be one of {', '.join(VERDICTS)}")
    if verdict == "bad" and not (isinstance(meta.get("reason"), str)
                                 and isinstance(meta.get("fails_on"), str)):
        raise SuiteError(f"{path}: a known-bad answer needs front matter reason (the "
                             "mistake) and fails_on (text of the expectation it must fail)")
    return verdict, meta.get("fails_on")


def judge(case: Case, path: Path) -> Outcome:
    """Grade one recorded answer and check the verdict matches its front matter."""
    t0 = time.perf_counter()
    answer = load_answer(path)
    verdict, fails_on = _expected(answer.meta, path)
    grade = grade_case(case.data, case.skill.card, answer, case.skill.folder_name)
    failed = [e.text for e in grade.expectations if not e.passed]
    if verdict == "golden":
        ok = grade.passed
        note = "" if ok else "golden answer failed: " + "; ".join(failed[:3])
    else:
        named = [t for t in failed if fails_on and fails_on.lower() in t.lower()]
        ok = not grade.passed and bool(named)
        note = ("" if ok else "known-bad answer passed" if grade.passed else
                f"failed, but no failed expectation names {fails_on!r} (failed: "
                f"{'; '.join(failed[:3])})")
    return Outcome(case.id, case.skill.folder_name, path.name, verdict, grade, ok, note,
                   time.perf_counter() - t0)


def answer_files(root: Path, case_id: str) -> list[Path]:
    folder = root / EVALS_DIR / case_id / ANSWERS
    return sorted(folder.glob("*.md")) + sorted(folder.glob("*.json")) if folder.is_dir() else []


def run_suite(root: Path, skill: str | None = None, out: Path | None = None,
              with_tools: bool = True) -> RunReport:
    """Grade every recorded answer (and our tools' answers); write grading.json per answer."""
    t0 = time.perf_counter()
    report = RunReport()
    for case in all_cases(root, skill):
        for path in answer_files(root, case.id):
            try:
                outcome = judge(case, path)
            except (AnswerError, SuiteError) as exc:
                outcome = Outcome(case.id, case.skill.folder_name, path.name, "?", None,
                                  False, str(exc))
            report.outcomes.append(outcome)
        if with_tools:
            tool = tool_outcome(case, root)
            if tool is not None:
                report.outcomes.append(tool)
    if out is not None:
        write_gradings(report, out)
    report.seconds = time.perf_counter() - t0
    return report


def write_gradings(report: RunReport, out: Path) -> None:
    for o in report.outcomes:
        if o.grade is None:
            continue
        folder = out / o.case / Path(o.answer).stem
        folder.mkdir(parents=True, exist_ok=True)
        data = o.grade.grading_json() | {"answer": o.answer, "recorded_verdict": o.verdict,
                                         "as_recorded": o.ok}
        (folder / "grading.json").write_text(json.dumps(data, indent=2) + "\n",
                                             encoding="utf-8")


def coverage(root: Path) -> list[str]:
    """Cases without the recorded answers the suite promises (positive: >= 1 golden and
    >= 2 known-bad; negative: >= 1 known-bad that claims the skill)."""
    gaps = []
    for case in all_cases(root):
        metas = []
        for p in answer_files(root, case.id):
            try:
                metas.append(load_answer(p).meta.get("verdict"))
            except AnswerError as exc:
                gaps.append(str(exc))
        golden, bad = metas.count("golden"), metas.count("bad")
        need_bad = 2 if case.positive else 1
        if golden < 1 or bad < need_bad:
            gaps.append(f"{case.id}: {golden} golden / {bad} known-bad answers; needs >= 1 / "
                        f">= {need_bad}")
    return gaps
