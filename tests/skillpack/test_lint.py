"""`mbridge-perf lint`: clean on the repository, exit 1 naming the file on each seeded defect."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from mbridge_perf.cli import main
from mbridge_perf.skillpack.lint import linked_references, lint, numbers_in_text, numeric_leaves
from mbridge_perf.skillpack.pack import get_skill, list_skills

from helpers import REPO, SKILL_NAMES, tool

MEM = "nemo-mbridge-perf-memory-tuning"


def run_lint(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(["lint", *args])
    out = capsys.readouterr().out
    return code, [line for line in out.splitlines() if line.strip()]


def test_repository_pack_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_lint(capsys, str(REPO))
    assert lines == [] and code == 0


def test_installed_console_script_exits_zero_on_the_repository() -> None:
    proc = subprocess.run([tool("mbridge-perf"), "lint"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_each_skill_folder_lints_on_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    for name in SKILL_NAMES:
        code, lines = run_lint(capsys, str(REPO / "skills" / name))
        assert (code, lines) == (0, []), name


def test_repository_has_exactly_the_four_seed_skills() -> None:
    assert tuple(s.folder_name for s in list_skills(REPO)) == SKILL_NAMES


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    """A writable copy of the pack to break."""
    root = tmp_path / "pack"
    shutil.copytree(REPO / "skills", root / "skills")
    shutil.copy2(REPO / "card.yaml", root / "card.yaml")
    return root


def _edit(path: Path, fn: Callable[[str], str]) -> None:
    before = path.read_text(encoding="utf-8")
    after = fn(before)
    assert after != before, f"defect did not change {path}"
    path.write_text(after, encoding="utf-8")


def _frontmatter_line(key: str, new: str) -> Callable[[str], str]:
    """Replace the first frontmatter line of ``key`` (a scalar on one line)."""
    return lambda text: re.sub(rf"(?m)^{key}:.*$", new, text, count=1)


def _swap_checklist_entries(text: str) -> str:
    start = text.index("## Answer checklist")
    end = text.index("\n## ", start + 5)
    section = text[start:end]
    entries = re.split(r"(?m)^(?=\d+\. )", section)
    head, first, second, *rest = entries
    return text[:start] + head + second + first + "".join(rest) + text[end:]


def _drop_measured_number(skill: Path) -> Callable[[str], str]:
    """Remove from SKILL.md every spelling of one measured number that no reference holds."""
    card = yaml.safe_load((skill / "card.yaml").read_text(encoding="utf-8"))
    body = (skill / "SKILL.md").read_text(encoding="utf-8")
    numbers = [v for t in card["measured_results"] for v in numeric_leaves(t["rows"])
               if isinstance(v, float) and "." in repr(v) and len(repr(v)) >= 4]
    refs = "".join(p.read_text(encoding="utf-8") for p in (skill / "references").glob("*.md"))
    target = next(v for v in numbers if repr(v) in body and repr(v) not in refs)
    pattern = re.compile(rf"(?<![\d.]){re.escape(repr(target))}(?!\d)")
    return lambda text: pattern.sub("[removed]", text)


DEFECTS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "bad-name": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", _frontmatter_line("name", "name: Memory_Tuning"))),
    "name-not-folder": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", _frontmatter_line("name", "name: nemo-mbridge-perf-memory"))),
    "description-too-long": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", _frontmatter_line(
            "description", "description: " + "Tunes GPU memory for OOM runs. " * 40))),
    "unknown-frontmatter-key": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", lambda t: t.replace(
            "\nlicense:", "\nwhen_to_use: OOM, out of memory\nlicense:", 1))),
    "checklist-out-of-order": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", _swap_checklist_entries)),
    "measured-number-missing": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", _drop_measured_number(p / f"skills/{MEM}"))),
    "malformed-evals-json": (f"skills/{MEM}/evals/evals.json", lambda p: _edit(
        p / f"skills/{MEM}/evals/evals.json", lambda t: t.rstrip().rstrip("]"))),
    "root-level-skill-md": ("SKILL.md", lambda p: shutil.copy2(
        p / f"skills/{MEM}/SKILL.md", p / "SKILL.md")),
    "evals-missing-key": (f"skills/{MEM}/evals/evals.json", lambda p: _edit(
        p / f"skills/{MEM}/evals/evals.json", lambda t: json.dumps(
            [{k: v for k, v in c.items() if k != "ground_truth"} for c in json.loads(t)]))),
    "no-negative-case": (f"skills/{MEM}/evals/evals.json", lambda p: _edit(
        p / f"skills/{MEM}/evals/evals.json", lambda t: json.dumps(
            [c for c in json.loads(t) if c["expected_skill"] is not None]))),
    "card-number-as-string": (f"skills/{MEM}/card.yaml", lambda p: _edit(
        p / f"skills/{MEM}/card.yaml", lambda t: re.sub(
            r"(?m)^(\s+\w+_pct:) (-?\d+(\.\d+)?)$", r"\1 '~\2'", t, count=1))),
    "missing-section": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", lambda t: t.replace("## Failure diagnosis",
                                                          "## Troubleshooting", 1))),
    "body-too-long": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", lambda t: t + "\nfiller line\n" * 500)),
    "flow-style-frontmatter": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", lambda t: t.replace(
            "\nlicense:", "\nallowed-tools: [Read, Bash]\nlicense:", 1))),
    "pack-card-misses-a-skill": ("card.yaml", lambda p: _edit(
        p / "card.yaml", lambda t: re.sub(
            rf"  - name: {MEM}\n    path: skills/{MEM}\n(    seed: .*\n)?", "", t))),
    "skill-folder-without-skill-md": ("skills/stray", lambda p: (
        p / "skills/stray").mkdir()),
    "link-to-missing-reference": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", lambda t: t.replace(
            "(references/levers.md)", "(references/lever.md)", 1))),
    "link-leaves-the-skill-folder": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", lambda t: t.replace(
            "## Purpose\n", "## Purpose\n\nSee [the card](../../card.yaml).\n", 1))),
    "reference-not-linked": (f"skills/{MEM}/references/extra.md", lambda p: (
        p / f"skills/{MEM}/references/extra.md").write_text("# Extra\n")),
    # the link is what makes the reference's numbers count: unlink it and they go missing
    "unlinked-reference-numbers": (f"skills/{MEM}/SKILL.md", lambda p: _edit(
        p / f"skills/{MEM}/SKILL.md", lambda t: t.replace(
            "[references/measurements.md](references/measurements.md)", "the references", 1))),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_seeded_defect_fails_lint_naming_the_file(
        defect: str, pack: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rel, apply = DEFECTS[defect]
    apply(pack)
    code, lines = run_lint(capsys, str(pack))
    assert code == 1, f"{defect}: lint passed"
    named = [line for line in lines if line.startswith(f"{pack / rel}: error: ")]
    assert named, f"{defect}: no error names {rel}: {lines}"


def test_lint_follows_links_for_measured_numbers() -> None:
    """79.2 GB (the estimator's total) lives only in a linked reference, and that suffices."""
    skill = get_skill(REPO, MEM)
    assert "79.2" not in skill.body
    refs = linked_references(skill)
    assert [p.name for p in refs] == ["levers.md", "measurements.md", "diagnosis.md"]
    assert any("79.2" in p.read_text(encoding="utf-8") for p in refs)
    assert lint(skill.path) == []


@pytest.mark.parametrize("name", SKILL_NAMES)
def test_every_skill_keeps_its_references_inside_its_folder(name: str) -> None:
    skill = get_skill(REPO, name)
    refs = linked_references(skill)
    assert refs, f"{name} links no references/*.md"
    assert all(p.parent == (skill.path / "references").resolve() for p in refs)
    assert sorted(refs) == sorted(p.resolve() for p in (skill.path / "references").glob("*.md"))


def test_checklist_defect_message_says_out_of_order(
        pack: Path, capsys: pytest.CaptureFixture[str]) -> None:
    DEFECTS["checklist-out-of-order"][1](pack)
    _, lines = run_lint(capsys, str(pack))
    assert any("out of order" in line for line in lines), lines


def test_unknown_rule_id_is_reported_once_a_catalog_exists(tmp_path: Path) -> None:
    skill = REPO / "skills" / MEM
    card = yaml.safe_load((skill / "card.yaml").read_text(encoding="utf-8"))
    assert card["rules"], "the memory-tuning card documents validator rules"
    known = set(card["rules"]) | {c["rule"] for c in card["known_constraints"] if "rule" in c}
    known |= {f["rule"] for f in card["failure_modes"] if "rule" in f}
    assert not lint(skill, rule_ids=known)
    missing = sorted(known)[0]
    findings = lint(skill, rule_ids=known - {missing})
    assert [f.severity for f in findings] == ["error"]
    assert missing in findings[0].message and findings[0].path.endswith("card.yaml")


def test_numbers_in_text_reads_decimals_ignoring_sign_and_units() -> None:
    found = numbers_in_text("TFLOP/s 668.0, −28.4 %, 4096 tokens, 58.8GB")
    assert {Decimal("668"), Decimal("28.4"), Decimal("4096"), Decimal("58.8")} <= found
