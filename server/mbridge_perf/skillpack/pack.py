"""Locate and read the skill pack: skills/<name>/{SKILL.md, card.yaml, evals/evals.json}.

Readers never execute anything: YAML goes through ``safe_load`` only.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

PACK_ENV = "MBRIDGE_PERF_PACK"
SKILL_FILE = "SKILL.md"
CARD_FILE = "card.yaml"
EVALS_FILE = "evals/evals.json"

_FRONTMATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)


class PackError(ValueError):
    """A pack or skill file cannot be read; the message names the file and what to do."""


def split_frontmatter(text: str) -> tuple[str | None, str]:
    """Return (frontmatter YAML text or None, body)."""
    m = _FRONTMATTER.match(text)
    if not m:
        return None, text
    return m.group(1), text[m.end():]


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PackError(f"{path}: not valid YAML: {_one_line(exc)}") from None


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PackError(f"{path}: not valid JSON: {exc}") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


@dataclass
class Skill:
    """One skill folder, read lazily so the linter can report each broken file on its own."""

    path: Path

    @property
    def folder_name(self) -> str:
        return self.path.name

    @cached_property
    def text(self) -> str:
        return (self.path / SKILL_FILE).read_text(encoding="utf-8")

    @cached_property
    def frontmatter(self) -> dict[str, Any]:
        fm, _ = split_frontmatter(self.text)
        if fm is None:
            raise PackError(f"{self.path / SKILL_FILE}: no YAML frontmatter between '---' lines")
        try:
            data = yaml.safe_load(fm)
        except yaml.YAMLError as exc:
            raise PackError(f"{self.path / SKILL_FILE}: frontmatter is not valid YAML: "
                            f"{_one_line(exc)}") from None
        if not isinstance(data, dict):
            raise PackError(f"{self.path / SKILL_FILE}: frontmatter must be a mapping of keys")
        return data

    @property
    def name(self) -> str:
        return str(self.frontmatter.get("name", self.folder_name))

    @cached_property
    def body(self) -> str:
        return split_frontmatter(self.text)[1]

    @cached_property
    def card(self) -> dict[str, Any]:
        data = load_yaml(self.path / CARD_FILE)
        if not isinstance(data, dict):
            raise PackError(f"{self.path / CARD_FILE}: must be a YAML mapping")
        return data

    @cached_property
    def evals(self) -> list[dict[str, Any]]:
        return load_json(self.path / EVALS_FILE)


def find_pack_root(start: Path | None = None) -> Path:
    """Where the pack lives: $MBRIDGE_PERF_PACK, a checkout at or above `start` (default: this
    package), or the copy bundled into the wheel at build time."""
    env = os.environ.get(PACK_ENV)
    if env:
        root = Path(env).expanduser().resolve()
        if not (root / "skills").is_dir():
            raise PackError(f"{PACK_ENV}={env}: no skills/ folder there; point it at the "
                            "mbridge-perf repository root")
        return root
    here = (start or Path(__file__)).resolve()
    for parent in (here, *here.parents):
        if (parent / "skills").is_dir() and (parent / CARD_FILE).is_file():
            return parent
    bundled = Path(__file__).resolve().parent.parent / "_pack"
    if (bundled / "skills").is_dir():
        return bundled
    raise PackError(f"cannot find the skill pack; set {PACK_ENV} to the mbridge-perf "
                    "repository root")


def list_skills(root: Path) -> list[Skill]:
    """Every folder under skills/ that holds a SKILL.md, sorted by folder name."""
    skills_dir = root / "skills"
    if not skills_dir.is_dir():
        return []
    return [Skill(p) for p in sorted(skills_dir.iterdir()) if (p / SKILL_FILE).is_file()]


def get_skill(root: Path, name: str) -> Skill:
    for skill in list_skills(root):
        if skill.folder_name == name:
            return skill
    known = ", ".join(s.folder_name for s in list_skills(root))
    raise PackError(f"unknown skill {name!r}; known skills: {known}")
