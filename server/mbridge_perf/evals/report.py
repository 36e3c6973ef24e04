"""Renderings of a suite run: the summary table on the terminal and JUnit XML for CI."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

from mbridge_perf.evals.suite import RunReport


def table(report: RunReport) -> str:
    rows = [("case", "answer", "recorded", "graded", "rate", "ok")]
    for o in report.outcomes:
        graded = ("unscored" if o.note.startswith("unscored") else "-") if o.grade is None \
            else ("pass" if o.grade.passed else "fail")
        rate = "-" if o.grade is None else f"{o.grade.summary.pass_rate:.0%}"
        rows.append((o.case, o.answer, o.verdict, graded, rate, "ok" if o.ok else "WRONG"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    for o in report.outcomes:
        if not o.ok:
            lines.append(f"WRONG {o.case}/{o.answer}: {o.note}")
        elif o.note.startswith("unscored"):
            lines.append(f"UNSCORED {o.case}/{o.answer}: {o.note}")
    n_ok = sum(o.ok for o in report.outcomes)
    golden = sum(o.verdict == "golden" for o in report.outcomes)
    bad = sum(o.verdict == "bad" for o in report.outcomes)
    cases = len({o.case for o in report.outcomes})
    lines.append(f"{n_ok}/{len(report.outcomes)} answers graded as recorded ({golden} golden, "
                 f"{bad} known-bad, {cases} cases) in {report.seconds:.2f} s")
    return "\n".join(lines)


def junit(report: RunReport, path: Path) -> None:
    """One testsuite per skill, one testcase per graded answer."""
    root = ET.Element("testsuites", name="mbridge-perf evals",
                      tests=str(len(report.outcomes)),
                      failures=str(sum(not o.ok for o in report.outcomes)),
                      time=f"{report.seconds:.3f}")
    suites: dict[str, ET.Element] = {}
    for o in report.outcomes:
        suite = suites.get(o.skill)
        if suite is None:
            suite = suites[o.skill] = ET.SubElement(root, "testsuite", name=o.skill)
        tc = ET.SubElement(suite, "testcase", classname=f"{o.skill}.{o.case}",
                           name=f"{o.answer} ({o.verdict})", time=f"{o.seconds:.4f}")
        if not o.ok:
            ET.SubElement(tc, "failure", message=o.note[:500]).text = o.note
        elif o.note.startswith("unscored"):
            ET.SubElement(tc, "skipped", message=o.note[:500])
        elif o.grade is not None:
            ET.SubElement(tc, "system-out").text = "\n".join(
                f"[{'PASS' if e.passed else 'NOTE' if not e.counted else 'FAIL'}] {e.text} — "
                f"{e.evidence}"
                for e in o.grade.expectations)
    for suite in suites.values():
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(tc.find("failure") is not None for tc in cases)))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
