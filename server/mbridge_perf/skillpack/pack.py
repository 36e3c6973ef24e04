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


MAX_PACK_FILE_BYTES = 4 << 20  # a SKILL.md, card or reference is tens of KB


def inside_pack(path: Path, root: Path) -> bool:
    """Whether ``path``, with every symlink followed, is a regular file under ``root``."""
    try:
        real = path.resolve(strict=True)
        return real.is_relative_to(root.resolve(strict=True)) and real.is_file()
    except (OSError, RuntimeError):
        return False


def read_pack_text(path: Path, root: Path | None = None) -> str:
    """A pack file's text, read only when it resolves inside the pack (a symlink out of the
    pack — `references/ -> /etc` — is refused) and is a plain file of bounded size."""
    base = root if root is not None else pack_root_of(path)
    if base is not None and not inside_pack(path, base):
        raise PackError(f"{path}: not a file inside the pack {base} (a symlink out of the pack "
                        "is never followed); replace it with the file itself")
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_PACK_FILE_BYTES + 1)
    except OSError as exc:
        raise PackError(f"{path}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_PACK_FILE_BYTES:
        raise PackError(f"{path}: over {MAX_PACK_FILE_BYTES:,} bytes; a pack file is small")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PackError(f"{path}: not UTF-8 text") from None


def pack_root_of(path: Path) -> Path | None:
    """The pack a skill file belongs to: the folder above `skills/` on its (unresolved) path."""
    parts = path.absolute().parts
    if "skills" not in parts:
        return None
    i = len(parts) - 1 - parts[::-1].index("skills")
    return Path(*parts[:i])


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(read_pack_text(path))
    except yaml.YAMLError as exc:
        raise PackError(f"{path}: not valid YAML: {_one_line(exc)}") from None


def load_json(path: Path) -> Any:
    try:
        return json.loads(read_pack_text(path))
    except json.JSONDecodeError as exc:
        raise PackError(f"{path}: not valid JSON: {exc}") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


@dataclass
class Skill:
    """One skill folder, read lazily so the linter can report each broken file on its own."""

    path: Path

    @property
    def root(self) -> Path:
        """The pack this skill belongs to (the folder holding skills/)."""
        return self.path.parent.parent

    def references(self) -> list[Path]:
        """references/*.md that are files inside the pack (symlinks out are left out)."""
        return [p for p in sorted((self.path / "references").glob("*.md"))
                if inside_pack(p, self.root)]

    @property
    def folder_name(self) -> str:
        return self.path.name

    @cached_property
    def text(self) -> str:
        return read_pack_text(self.path / SKILL_FILE, self.root)

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
