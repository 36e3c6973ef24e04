"""`mbridge-perf eval validate | grade | run | export` (the CLI door calls these)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from mbridge_perf.evals.answer import AnswerError, load_answer, tool_name
from mbridge_perf.evals.grade import Grade, grade_case, grade_skill
from mbridge_perf.evals.suite import SuiteError, all_cases, find_case
from mbridge_perf.skillpack.pack import PackError, find_pack_root, get_skill


def _root() -> Path:
    return find_pack_root(Path.cwd())


def validate_evals(root: Path, inputs: bool = True) -> list[str]:
    """Schema errors of every evals.json, and (``inputs``) case inputs (config, log) that do
    not load."""
    import jsonschema

    from mbridge_perf.evals.tools import case_config, case_file
    from mbridge_perf.skillpack.pack import EVALS_FILE, list_skills
    from mbridge_perf.skillpack.schemas import load_schema

    validator = jsonschema.Draft202012Validator(load_schema("evals"))

    problems: list[str] = []
    for skill in list_skills(root):
        path = skill.path / EVALS_FILE
        try:
            data = skill.evals
        except (PackError, OSError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        errors = [f"{path}: {'/'.join(str(p) for p in e.absolute_path) or '(top level)'}: "
                  f"{' '.join(e.message.split())[:200]}"
                  for e in sorted(validator.iter_errors(data), key=lambda e: list(e.path))]
        problems += errors
        if errors or not inputs:
            continue
        for case in all_cases(root, skill.folder_name):
            try:
                case_config(case)
                if "log" in case.data:
                    case_file(case, case.data["log"], "log")
            except SuiteError as exc:
                problems.append(f"{path}: {exc}")
    return problems


def _require_valid(root: Path, out: Path, skill: str | None = None) -> None:
    """Before `eval run` / `eval export` write anything: every evals.json passes its schema
    and every case's folder under ``out`` stays inside it."""
    from mbridge_perf.evals.export import inside

    problems = validate_evals(root, inputs=False)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise SuiteError(f"{problems[0]}{more}; nothing was written: fix the cases "
                         "(`mbridge-perf eval validate` lists every problem)")
    for case in all_cases(root, skill):
        inside(out, case.id)


def _cmd_validate(args: argparse.Namespace) -> int:
    root = _root()
    problems = validate_evals(root)
    for p in problems:
        print(p)
    n = len(all_cases(root)) if not problems else 0
    print(f"{len(problems)} problem(s)" if problems else f"ok: {n} cases")
    return 1 if problems else 0


def _print_grade(grade: Grade, as_json: bool) -> None:
    if as_json:
        print(json.dumps(grade.grading_json() | {"expectations": [
            e.model_dump() for e in grade.expectations]}, indent=2))
        return
    for e in grade.expectations:
        flag = ("PASS" if e.passed else "NOTE" if not e.counted
                else "FAIL*" if e.critical else "FAIL")
        print(f"[{flag}] {e.text}\n        {e.evidence}")
    s = grade.summary
    print(f"{'PASSED' if grade.passed else 'FAILED'} {grade.target}: {s.passed}/{s.total} "
          f"({s.pass_rate:.0%})" + (f"; critical failed: {len(grade.failed_critical)}"
                                   if grade.failed_critical else ""))


def _cmd_grade(args: argparse.Namespace) -> int:
    root = _root()
    answer = load_answer(Path(args.answer))
    if args.tool_calls is not None:
        answer.tool_calls = [tool_name(t) for t in args.tool_calls.split(",") if t.strip()]
    if args.case:
        case = find_case(root, args.case)
        grade = grade_case(case.data, case.skill.card, answer, case.skill.folder_name)
    else:
        skill = get_skill(root, args.skill)
        grade = grade_skill(skill.card, answer, skill.folder_name)
    _print_grade(grade, args.json)
    return 0 if grade.passed else 1


def _cmd_run(args: argparse.Namespace) -> int:
    from mbridge_perf.evals.report import junit, table
    from mbridge_perf.evals.suite import run_suite

    root = _root()
    out = Path(args.out) if args.out else root / "evals" / "results" / "grading"
    _require_valid(root, out, args.skill)
    report = run_suite(root, args.skill, out)
    print(table(report))
    if args.junit:
        junit(report, Path(args.junit))
    return 0 if report.ok else 1


def _cmd_export(args: argparse.Namespace) -> int:
    from mbridge_perf.evals.export import drift, export

    root = _root()
    if args.check:
        problems = drift(root)
        for p in problems:
            print(p)
        print(f"{len(problems)} case file(s) out of date; run `mbridge-perf eval export`"
              if problems else "ok: every case.yaml matches evals.json")
        return 1 if problems else 0
    from mbridge_perf.evals.suite import EVALS_DIR

    _require_valid(root, root / EVALS_DIR)
    changed = export(root)
    print(f"wrote {len(changed)} case.yaml file(s) under {root / 'evals'}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("eval", help="grade answers against the skills' evals (offline)")
    act = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = act.add_parser("validate", help="schema-check every evals.json and its case inputs")
    q.set_defaults(func=_guarded(_cmd_validate))
    q = act.add_parser("grade", help="grade one answer file (Markdown or a tool's JSON)")
    who = q.add_mutually_exclusive_group(required=True)
    who.add_argument("--case", help="case id from an evals.json")
    who.add_argument("--skill", help="skill name: grade against its answer checklist alone")
    q.add_argument("--answer", required=True, help="answer file")
    q.add_argument("--json", action="store_true", help="JSON with a top-level boolean passed")
    q.add_argument("--tool-calls", help="comma-separated tools the answer came from or called "
                                        "(overrides the front matter), e.g. estimate_memory")
    q.set_defaults(func=_guarded(_cmd_grade))
    q = act.add_parser("run", help="grade every recorded answer and our tools' answers")
    q.add_argument("--skill", help="only this skill's cases")
    q.add_argument("--junit", help="also write JUnit XML here")
    q.add_argument("--out", help="folder for grading.json files (default evals/results/grading)")
    q.set_defaults(func=_guarded(_cmd_run))
    q = act.add_parser("export", help="write the Claude Code cases (evals/<id>/case.yaml)")
    q.add_argument("--check", action="store_true", help="only report drift; exit 1 on any")
    q.set_defaults(func=_guarded(_cmd_export))


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Unusable input (answer file, suite, pack) is one line naming it and exit 2."""
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (AnswerError, SuiteError, PackError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return run
