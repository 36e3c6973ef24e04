"""`mbridge-perf eval …` as a user runs it in CI: exit codes, JSON, grading.json, JUnit XML."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from helpers import REPO, tool

CASE = "memory-tuning-positive-fragmentation-first-fix"
ANSWERS = REPO / "evals" / CASE / "answers"


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("mbridge-perf"), "eval", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=120)


def test_validate_schema_checks_every_evals_json() -> None:
    r = run("validate")
    assert r.returncode == 0 and r.stdout.strip().endswith("cases"), r.stdout + r.stderr


def test_grade_a_case_as_json_has_a_top_level_passed() -> None:
    good = run("grade", "--case", CASE, "--answer", str(ANSWERS / "golden.md"), "--json")
    assert good.returncode == 0
    data = json.loads(good.stdout)
    assert data["passed"] is True and data["summary"]["failed"] == 0
    bad = run("grade", "--case", CASE, "--answer", str(ANSWERS / "bad-tp-first.md"), "--json")
    assert bad.returncode == 1
    data = json.loads(bad.stdout)
    assert data["passed"] is False
    failed = [e for e in data["expectations"] if not e["passed"]]
    assert any("TP=8" in e["text"] and "TP=8" in e["evidence"] for e in failed)


def test_grade_against_a_skill_checklist_alone(tmp_path: Path) -> None:
    answer = tmp_path / "a.md"
    answer.write_text("1. Export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.\n"
                      "2. If it still OOMs, use selective recompute with layernorm.\n"
                      "3. Only as a last resort add mlp (about 16%).\n\n"
                      "Raising TP 4 -> 8 cost -28.4%; PP 8 cost -5.9%. CPU offload needs PP=1.\n")
    r = run("grade", "--skill", "nemo-mbridge-perf-memory-tuning", "--answer", str(answer),
            "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["passed"] is True
    answer.write_text("Raise TP to 8.\n")
    r = run("grade", "--skill", "nemo-mbridge-perf-memory-tuning", "--answer", str(answer))
    assert r.returncode == 1 and "FAILED" in r.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = run("grade", "--case", "no-such-case", "--answer", str(ANSWERS / "golden.md"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no-such-case" in r.stderr
    r = run("grade", "--case", CASE, "--answer", str(tmp_path / "missing.md"))
    assert r.returncode == 2 and "missing.md" in r.stderr and "Traceback" not in r.stderr
    broken = tmp_path / "b.md"
    broken.write_text("---\ntool_calls: [a\n---\ntext\n")
    r = run("grade", "--case", CASE, "--answer", str(broken))
    assert r.returncode == 2 and "front matter" in r.stderr


def test_run_writes_grading_json_and_junit(tmp_path: Path) -> None:
    out, xml = tmp_path / "g", tmp_path / "junit.xml"
    r = run("run", "--skill", "nemo-mbridge-perf-memory-tuning", "--out", str(out),
            "--junit", str(xml))
    assert r.returncode == 0, r.stdout[-2000:]
    assert "answers graded as recorded" in r.stdout
    grading = json.loads((out / CASE / "bad-tp-first" / "grading.json").read_text())
    assert grading["passed"] is False and grading["as_recorded"] is True
    suites = ET.parse(xml).getroot()
    assert suites.get("failures") == "0" and int(suites.get("tests", "0")) >= 20


def _pack_copy(tmp_path: Path) -> Path:
    root = tmp_path / "pack"
    for rel in ("skills", "evals"):
        shutil.copytree(REPO / rel, root / rel, ignore=shutil.ignore_patterns("results"))
    shutil.copy(REPO / "card.yaml", root / "card.yaml")
    return root


def test_run_exits_1_when_a_known_bad_answer_passes(tmp_path: Path) -> None:
    root = _pack_copy(tmp_path)
    bad = root / "evals" / CASE / "answers" / "bad-tp-first.md"
    golden = (root / "evals" / CASE / "answers" / "golden.md").read_text()
    bad.write_text(golden.replace("verdict: golden", "verdict: bad\nreason: relabelled on "
                                  "purpose to prove the gate\nfails_on: TP=8", 1))
    r = subprocess.run([tool("mbridge-perf"), "eval", "run", "--out", str(tmp_path / "o")],
                       cwd=root, text=True, capture_output=True, timeout=120,
                       env={"PATH": str(Path(tool("mbridge-perf")).parent),
                            "MBRIDGE_PERF_PACK": str(root)})
    assert r.returncode == 1
    assert f"WRONG {CASE}/bad-tp-first.md: known-bad answer passed" in r.stdout


def test_export_check_reports_no_drift() -> None:
    r = run("export", "--check")
    assert r.returncode == 0, r.stdout


def test_ci_runs_the_eval_suite() -> None:
    """.ci/run runs the README's test command, ./scripts/run-tests, which runs eval run."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "<!-- test-command -->\n```bash\n./scripts/run-tests\n```" in readme
    script = (REPO / "scripts" / "run-tests").read_text(encoding="utf-8")
    assert "\nmbridge-perf eval run " in script
    assert script.index("mbridge-perf eval run") < script.index("python -m pytest")


def test_validate_names_a_missing_input_and_a_schema_error(tmp_path: Path) -> None:
    root = _pack_copy(tmp_path)
    path = root / "skills" / "nemo-mbridge-perf-memory-tuning" / "evals" / "evals.json"
    cases = json.loads(path.read_text())
    tool_case = next(c for c in cases if c.get("tool") == "diagnose_oom")
    tool_case["log"] = "../../../etc/passwd"
    path.write_text(json.dumps(cases))
    r = subprocess.run([tool("mbridge-perf"), "eval", "validate"], cwd=root, text=True,
                       capture_output=True, timeout=60, env={"MBRIDGE_PERF_PACK": str(root)})
    assert r.returncode == 1 and "log" in r.stdout, r.stdout
    tool_case["log"] = "no-such.log"
    path.write_text(json.dumps(cases))
    r = subprocess.run([tool("mbridge-perf"), "eval", "validate"], cwd=root, text=True,
                       capture_output=True, timeout=60, env={"MBRIDGE_PERF_PACK": str(root)})
    assert r.returncode == 1 and "'no-such.log' must be a file under" in r.stdout, r.stdout
    del tool_case["log"], tool_case["config"]
    path.write_text(json.dumps(cases))
    r = subprocess.run([tool("mbridge-perf"), "eval", "validate"], cwd=root, text=True,
                       capture_output=True, timeout=60, env={"MBRIDGE_PERF_PACK": str(root)})
    assert r.returncode == 1 and tool_case["id"] not in r.stderr and "Traceback" not in r.stderr
    assert "evals.json" in r.stdout


def test_a_tools_json_output_is_graded_by_its_answer_markdown(tmp_path: Path) -> None:
    out = subprocess.run([tool("mbridge-perf"), "estimate", "examples/llama3_70b_sft_h100.yaml",
                          "--preset", "llama3-70b", "--json"], cwd=REPO, text=True,
                         capture_output=True, timeout=120)
    answer = tmp_path / "estimate.json"
    answer.write_text(out.stdout)
    r = run("grade", "--case", "memory-tuning-positive-prelaunch-estimate", "--answer",
            str(answer), "--tool-calls", "estimate_memory", "--json")
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["passed"] is True, [
        e for e in data["expectations"] if not e["passed"]]
    assert any(e["text"].endswith("$.per_stage[*]") and e["passed"]
               for e in data["expectations"])


@pytest.mark.parametrize("case_id", ["../../escaped", "/tmp/abs-escaped", "a/../../escaped",
                                     "..", "ok-positive-x/../../../escaped"])
@pytest.mark.parametrize("action", ["export", "run"])
def test_run_and_export_validate_before_writing_and_stay_in_their_folder(
        tmp_path: Path, action: str, case_id: str) -> None:
    root = _pack_copy(tmp_path)
    path = root / "skills" / "nemo-mbridge-perf-memory-tuning" / "evals" / "evals.json"
    cases = json.loads(path.read_text())
    cases[0]["id"] = case_id
    path.write_text(json.dumps(cases))
    before = sorted(p for p in tmp_path.rglob("*"))
    out = tmp_path / "pack" / "o"
    args = ["eval", action] + (["--out", str(out)] if action == "run" else [])
    r = subprocess.run([tool("mbridge-perf"), *args], cwd=root, text=True,
                       capture_output=True, timeout=120, env={"MBRIDGE_PERF_PACK": str(root)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "nothing was written" in r.stderr
    assert sorted(p for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/abs-escaped").exists()


def test_export_path_check_refuses_an_id_that_leaves_the_folder(tmp_path: Path) -> None:
    from mbridge_perf.evals.export import inside
    from mbridge_perf.evals.suite import SuiteError

    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "link").symlink_to(tmp_path.parent)
    for bad in ("../x", "/etc", "a/b", "..", "link", ""):
        with pytest.raises(SuiteError, match="would write outside"):
            inside(tmp_path / "evals", bad)
    assert inside(tmp_path / "evals", "ok-positive-x") == tmp_path / "evals" / "ok-positive-x"
