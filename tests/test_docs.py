"""README.md stays short with the set-up commands first; the long sections live in docs/, every
relative link resolves, and docs/tools.md is what the generator writes from tools/list."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
SERVE = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/mbridge-perf serve"
TEST_COMMAND = "./scripts/run-tests"

FENCE = re.compile(r"^```(\S*)\n(.*?)^```\s*$", re.M | re.S)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The text outside fenced blocks, with inline code spans removed."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = _slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_readme_is_at_most_25_kib() -> None:
    size = len(README.read_bytes())
    assert size <= 25 * 1024, f"README.md is {size} bytes; move detail into docs/"


def test_readme_opens_with_the_two_set_up_commands() -> None:
    text = README.read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", _prose(text), re.M)
    assert sections[0] == "Set-up on a fresh machine", sections
    blocks = FENCE.findall(text)
    bash = [body.strip() for info, body in blocks if info == "bash"]
    assert bash[:2] == [SERVE, TEST_COMMAND], bash[:2]
    assert blocks[0] == ("bash", SERVE + "\n"), "the server command is the first fenced block"
    assert f"<!-- test-command -->\n```bash\n{TEST_COMMAND}\n```" in text
    assert text.index(SERVE) < text.index("<!-- test-command -->")


def test_ci_extracts_the_readme_test_command() -> None:
    """.ci/run's own awk program finds ./scripts/run-tests in README.md."""
    if not shutil.which("awk"):
        pytest.skip("awk not installed")
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    program = re.search(r"cmd=\$\(awk '(.+)' README\.md\)", script).group(1)
    out = subprocess.run(["awk", program, str(README)], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    assert out.strip() == TEST_COMMAND


def test_readme_lists_every_mcp_tool_once_linked_to_its_reference() -> None:
    snapshot = json.loads((REPO / "tests" / "snapshots" / "tools_list.json").read_text())
    tools = snapshot["tools"] if isinstance(snapshot, dict) else snapshot
    names = [t["name"] for t in tools]
    text = README.read_text(encoding="utf-8")
    listed = re.findall(r"^- \[`(\w+)`\]\(docs/tools\.md#[\w-]+\) — \S", text, re.M)
    assert listed == names


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, …
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{path.name}: {broken}"


def test_docs_exist_and_the_readme_links_each() -> None:
    names = {p.name for p in DOCS}
    assert {"tools.md", "install.md", "configs.md", "memory.md", "planning.md",
            "benchmarks.md", "evals.md", "lint.md"} <= names
    text = README.read_text(encoding="utf-8")
    assert all(f"(docs/{name})" in text for name in names), names


def test_tool_reference_lives_in_docs_and_is_current() -> None:
    assert "<!-- tools:start -->" not in README.read_text(encoding="utf-8")
    reference = (REPO / "docs" / "tools.md").read_text(encoding="utf-8")
    assert "<!-- tools:start -->" in reference and "<!-- tools:end -->" in reference
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_tool_reference.py"),
                           "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
