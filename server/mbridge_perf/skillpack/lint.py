"""Lint the skill pack: Agent Skills frontmatter, our schemas, body size and the agreement
between each SKILL.md, its card.yaml and its evals.json (one source of truth, three renderings).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

import jsonschema

from mbridge_perf import __version__
from mbridge_perf.skillpack.pack import (
    CARD_FILE,
    EVALS_FILE,
    SKILL_FILE,
    PackError,
    Skill,
    list_skills,
    load_yaml,
    read_pack_text,
    split_frontmatter,
)
from mbridge_perf.skillpack.schemas import SchemaName, load_schema

Severity = Literal["error", "warning"]

# Agent Skills specification (agentskills.io): the only top-level frontmatter keys the strict
# validator accepts, and the limits it enforces.
ALLOWED_FRONTMATTER = frozenset(
    {"name", "description", "license", "compatibility", "metadata", "allowed-tools"})
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
NAME_MAX = 64
DESCRIPTION_MAX = 1024
COMPATIBILITY_MAX = 500
BODY_MAX_LINES = 500
# This pack's own conventions on top of the spec.
PACK_LICENSE = "Apache-2.0"
REQUIRED_METADATA = ("author", "tags", "version")
REQUIRED_SECTIONS = (
    "Purpose", "Answer checklist", "Instructions", "Examples", "Enablement", "Constraints",
    "Measured results", "Failure diagnosis", "Known limitations", "Verification",
)
MIN_POSITIVE_CASES = 2
MIN_NEGATIVE_CASES = 1

_FLOW_VALUE = re.compile(r"^\s*[\w-]+:\s*[\[{]")
_XML_TAG = re.compile(r"<[A-Za-z/][^>]{0,500}>")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+)$")  # closing #s stripped by the caller
_NUMBERED = re.compile(r"^\s{0,3}(\d+)[.)]\s+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_NORMALISE = re.compile(r"[\s_\-`'\"*]+")
# a Markdown link's target: [text](target) or [text](<target> "title")
_LINK = re.compile(r"\[[^\[\]\n]{0,500}\]\(\s{0,8}<?([^)\s>\[(]{1,500})>?"
                   r"(?:\s{1,8}\"[^\"]{0,500}\")?\s{0,8}\)")
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)", re.IGNORECASE)
REFERENCES_DIR = "references"


@dataclass(frozen=True)
class Finding:
    path: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.path}: {self.severity}: {self.message}"


def lint(target: Path, rule_ids: set[str] | None = None) -> list[Finding]:
    """Lint a pack root (has skills/) or one skill folder (has SKILL.md).

    ``rule_ids`` is the validator catalog; when None it is looked up, and rule-id checks are
    skipped while no catalog exists.
    """
    target = Path(target)
    if rule_ids is None:
        rule_ids = _catalog_rule_ids()
    if not target.exists():
        return [Finding(str(target), "no such file or folder")]
    if (target / SKILL_FILE).is_file() and not (target / "skills").is_dir():
        return list(_lint_skill(Skill(target), rule_ids))
    if not (target / "skills").is_dir():
        return [Finding(str(target), "neither a skill folder (SKILL.md) nor a pack root "
                                     "(skills/); pass the repository root or skills/<name>")]
    return list(_lint_pack(target, rule_ids))


def _catalog_rule_ids() -> set[str] | None:
    try:
        from mbridge_perf.rules import rule_ids  # type: ignore[import-not-found]
    except ImportError:
        return None
    return set(rule_ids())


# ---------------------------------------------------------------- pack level

def _lint_pack(root: Path, rule_ids: set[str] | None) -> Iterator[Finding]:
    if (root / SKILL_FILE).exists():
        yield Finding(str(root / SKILL_FILE),
                      "a root-level SKILL.md hides every skill under skills/ from "
                      "`npx skills add`; move it into skills/<name>/")
    skills = list_skills(root)
    if not skills:
        yield Finding(str(root / "skills"), "no skill folders (skills/<name>/SKILL.md) found")
    for folder in sorted((root / "skills").iterdir()):
        if folder.is_dir() and not (folder / SKILL_FILE).is_file():
            yield Finding(str(folder), "folder under skills/ without a SKILL.md; add one or "
                                       "move the folder out of skills/")
    for skill in skills:
        yield from _lint_skill(skill, rule_ids)
    yield from _lint_cross_skill(skills)
    yield from _lint_pack_card(root, skills)


def _lint_cross_skill(skills: list[Skill]) -> Iterator[Finding]:
    seen_names: dict[str, Path] = {}
    seen_ids: dict[str, Path] = {}
    for skill in skills:
        try:
            name = skill.name
            cases = skill.evals
        except (PackError, OSError):
            continue  # already reported per skill
        if name in seen_names:
            yield Finding(str(skill.path / SKILL_FILE),
                          f"duplicate skill name {name!r} (also {seen_names[name]}); "
                          "`npx skills add` silently keeps only the first")
        seen_names[name] = skill.path
        for case in cases if isinstance(cases, list) else []:
            cid = case.get("id") if isinstance(case, dict) else None
            if isinstance(cid, str):
                if cid in seen_ids:
                    yield Finding(str(skill.path / EVALS_FILE),
                                  f"eval id {cid!r} also used in {seen_ids[cid]}; ids must be "
                                  "unique across the pack")
                seen_ids[cid] = skill.path / EVALS_FILE


def _lint_pack_card(root: Path, skills: list[Skill]) -> Iterator[Finding]:
    path = root / CARD_FILE
    if not path.is_file():
        yield Finding(str(path), "pack card missing; add card.yaml (name, version, description, "
                                 "skills, tools, validated_on)")
        return
    try:
        card = load_yaml(path)
    except PackError as exc:
        yield Finding(str(path), str(exc).split(": ", 1)[1])
        return
    errors = list(_schema_errors(card, "pack_card"))
    for msg in errors:
        yield Finding(str(path), msg)
    if errors:
        return
    listed = {s["name"]: s["path"] for s in card["skills"]}
    present = {s.folder_name for s in skills}
    for name in sorted(present - listed.keys()):
        yield Finding(str(path), f"skill {name!r} is in skills/ but not listed under skills:")
    for name, rel in sorted(listed.items()):
        if name not in present:
            yield Finding(str(path), f"skills: lists {name!r} but skills/{name}/SKILL.md "
                                     "does not exist")
        elif rel != f"skills/{name}":
            yield Finding(str(path), f"skills: {name!r} has path {rel!r}; expected "
                                     f"'skills/{name}'")
    if card["version"] != __version__:
        yield Finding(str(path), f"version {card['version']!r} differs from the package "
                                 f"version {__version__!r}; keep them equal")


# ---------------------------------------------------------------- one skill

def _lint_skill(skill: Skill, rule_ids: set[str] | None) -> Iterator[Finding]:
    skill_md = str(skill.path / SKILL_FILE)
    try:
        text = skill.text
    except OSError:
        yield Finding(skill_md, "missing; every skill folder needs a SKILL.md")
        return
    fm_text, body = split_frontmatter(text)
    if fm_text is None:
        yield Finding(skill_md, "no YAML frontmatter; start the file with '---', name, "
                                "description, '---'")
    else:
        try:
            fm = skill.frontmatter
        except PackError as exc:
            yield Finding(skill_md, str(exc).split(": ", 1)[1])
        else:
            yield from _lint_frontmatter(skill_md, fm_text, fm, skill.folder_name)
    yield from _lint_body(skill_md, body)

    yield from _lint_links(skill, body)
    card = yield from _load_checked(skill, CARD_FILE, "skill_card")
    cases = yield from _load_checked(skill, EVALS_FILE, "evals")
    if card is not None:
        yield from _lint_checklist(skill_md, body, card)
        yield from _lint_numbers(skill_md, readable_text(skill), card)
        yield from _lint_rule_ids(str(skill.path / CARD_FILE), card, rule_ids)
    if cases is not None:
        yield from _lint_cases(str(skill.path / EVALS_FILE), cases, skill.folder_name, card)


def _link_targets(body: str) -> list[str]:
    """Relative link targets in the body (outside code fences), anchors stripped, in order."""
    targets: list[str] = []
    in_fence = False
    for line in body.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if not in_fence:
            targets += [t.split("#", 1)[0] for t in _LINK.findall(line)
                        if not _EXTERNAL.match(t) and t.split("#", 1)[0]]
    return targets


def linked_references(skill: Skill) -> list[Path]:
    """The Markdown files in the skill folder that SKILL.md links to, in link order — what an
    agent reads on demand beside the body (progressive disclosure)."""
    folder = skill.path.resolve()
    out: list[Path] = []
    for target in _link_targets(skill.body):
        path = (skill.path / target).resolve()
        if (path.suffix == ".md" and path.is_file() and path.is_relative_to(folder)
                and path != folder / SKILL_FILE and path not in out):
            out.append(path)
    return out


def readable_text(skill: Skill) -> str:
    """SKILL.md's body plus every reference it links: where a fact must be findable."""
    return "\n\n".join([skill.body, *(read_pack_text(p, skill.root)
                                      for p in linked_references(skill))])


def _lint_links(skill: Skill, body: str) -> Iterator[Finding]:
    """Links must resolve inside the skill folder (`npx skills add` copies only that folder), and
    every file under references/ must be linked, or no agent ever reads it."""
    skill_md = str(skill.path / SKILL_FILE)
    folder = skill.path.resolve()
    for target in dict.fromkeys(_link_targets(body)):
        path = (skill.path / target).resolve()
        if not path.is_relative_to(folder):
            yield Finding(skill_md, f"link {target!r} leaves the skill folder; installers copy "
                                    "only the folder, so keep linked files inside it")
        elif not path.exists():
            yield Finding(skill_md, f"link {target!r}: no such file in the skill folder")
        elif (path.is_relative_to(folder / REFERENCES_DIR)
              and path.parent != folder / REFERENCES_DIR):
            yield Finding(skill_md, f"link {target!r}: keep references one level deep "
                                    f"({REFERENCES_DIR}/<file>.md)", "warning")
    linked = set(linked_references(skill))
    refs = skill.path / REFERENCES_DIR
    for path in sorted(refs.rglob("*.md")) if refs.is_dir() else []:
        if path.resolve() not in linked:
            yield Finding(str(path), "not linked from SKILL.md; link it where the body needs "
                                     "the detail, or delete it")


def _load_checked(skill: Skill, rel: str, schema: SchemaName):
    """Load a card or evals file and schema-check it; return the data only when it is valid."""
    path = skill.path / rel
    if not path.is_file():
        yield Finding(str(path), f"missing; every skill needs {rel}")
        return None
    try:
        data = skill.card if rel == CARD_FILE else skill.evals
    except PackError as exc:
        yield Finding(str(path), str(exc).split(": ", 1)[1])
        return None
    errors = list(_schema_errors(data, schema))
    for msg in errors:
        yield Finding(str(path), msg)
    return None if errors else data


def _schema_errors(data: Any, schema: SchemaName) -> Iterator[str]:
    validator = jsonschema.Draft202012Validator(load_schema(schema))
    for err in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        yield f"{where}: {_short(err.message)}"


def _short(message: str, limit: int = 200) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _lint_frontmatter(path: str, fm_text: str, fm: dict[str, Any], folder: str
                      ) -> Iterator[Finding]:
    for line in fm_text.splitlines():
        if _FLOW_VALUE.match(line):
            yield Finding(path, f"frontmatter line {line.strip()!r} uses flow style ([..] or "
                                "{..}); the strict validator rejects it, use a block list")
    for key in sorted(set(fm) - ALLOWED_FRONTMATTER):
        yield Finding(path, f"frontmatter key {key!r} is not in the Agent Skills spec (allowed: "
                            f"{', '.join(sorted(ALLOWED_FRONTMATTER))}); move it into metadata "
                            "or drop it")
    name = fm.get("name")
    if not isinstance(name, str) or not name:
        yield Finding(path, "frontmatter 'name' is required")
    else:
        if len(name) > NAME_MAX:
            yield Finding(path, f"name is {len(name)} chars; the limit is {NAME_MAX}")
        if not NAME_RE.match(name):
            yield Finding(path, f"name {name!r} must be lowercase letters, digits and single "
                                "hyphens, not starting or ending with '-'")
        if name != folder:
            yield Finding(path, f"name {name!r} must equal the folder name {folder!r}")
    desc = fm.get("description")
    if not isinstance(desc, str) or not desc.strip():
        yield Finding(path, "frontmatter 'description' is required: say what the skill does "
                            "and when to use it")
    else:
        if len(desc) > DESCRIPTION_MAX:
            yield Finding(path, f"description is {len(desc)} chars; the limit is "
                                f"{DESCRIPTION_MAX}")
        if _XML_TAG.search(desc) or (isinstance(name, str) and _XML_TAG.search(name)):
            yield Finding(path, "name and description must not contain XML tags")
    comp = fm.get("compatibility")
    if comp is not None and (not isinstance(comp, str) or not 1 <= len(comp) <= COMPATIBILITY_MAX):
        yield Finding(path, f"compatibility must be a string of 1-{COMPATIBILITY_MAX} chars")
    tools = fm.get("allowed-tools")
    if tools is not None and not (isinstance(tools, str) or (
            isinstance(tools, list) and all(isinstance(t, str) for t in tools))):
        yield Finding(path, "allowed-tools must be a space-separated string or a list of strings")
    if fm.get("license") != PACK_LICENSE:
        yield Finding(path, f"license must be {PACK_LICENSE!r} in this pack")
    meta = fm.get("metadata")
    if not isinstance(meta, dict):
        yield Finding(path, "metadata must be a mapping with author, tags and version")
        return
    for key, value in meta.items():
        if not isinstance(value, str):
            yield Finding(path, f"metadata.{key} must be a string (the spec's metadata is "
                                f"string to string); quote it")
    for key in REQUIRED_METADATA:
        if key not in meta:
            yield Finding(path, f"metadata.{key} is missing")


def _sections(body: str) -> list[tuple[str, int, int]]:
    """Level-2 sections as (title, first line, end line) of the body."""
    lines = body.splitlines()
    heads: list[tuple[str, int]] = []
    in_fence = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        m = _HEADING.match(line)
        if m and not in_fence and len(m.group(1)) == 2:
            heads.append((m.group(2).rstrip().rstrip("#").strip(), i))
    return [(title, start, heads[k + 1][1] if k + 1 < len(heads) else len(lines))
            for k, (title, start) in enumerate(heads)]


def _lint_body(path: str, body: str) -> Iterator[Finding]:
    n = len(body.splitlines())
    if n >= BODY_MAX_LINES:
        yield Finding(path, f"body has {n} lines; keep it under {BODY_MAX_LINES} (move detail "
                            "into references/)")
    titles = [t.lower() for t, _, _ in _sections(body)]
    last = -1
    for section in REQUIRED_SECTIONS:
        if section.lower() not in titles:
            yield Finding(path, f"missing section '## {section}'")
            continue
        idx = titles.index(section.lower())
        if idx < last:
            yield Finding(path, f"section '## {section}' is out of order; expected order: "
                                f"{', '.join(REQUIRED_SECTIONS)}")
        last = max(last, idx)


def _section_text(body: str, title: str) -> str | None:
    lines = body.splitlines()
    for t, start, end in _sections(body):
        if t.lower() == title.lower():
            return "\n".join(lines[start + 1:end])
    return None


def _numbered_entries(text: str) -> list[str]:
    entries: list[list[str]] = []
    for line in text.splitlines():
        if _NUMBERED.match(line):
            entries.append([line])
        elif entries and line.strip():
            entries[-1].append(line)
    return ["\n".join(e) for e in entries]


def _norm(text: str) -> str:
    return _NORMALISE.sub("", text.lower())


def _matches(entry: str, terms: Iterable[str]) -> bool:
    low, squeezed = entry.lower(), _norm(entry)
    return any(t.lower() in low or _norm(t) in squeezed for t in terms)


def _lint_checklist(path: str, body: str, card: dict[str, Any]) -> Iterator[Finding]:
    items = card["answer_checklist"]
    section = _section_text(body, "Answer checklist")
    if section is None:
        return  # reported as a missing section
    entries = _numbered_entries(section)
    if len(entries) != len(items):
        yield Finding(path, f"Answer checklist has {len(entries)} numbered entries but "
                            f"card.yaml answer_checklist has {len(items)} items; render each "
                            "item once, in order")
    for k, item in enumerate(items):
        if k < len(entries) and _matches(entries[k], item["match"]):
            continue
        elsewhere = [j + 1 for j, e in enumerate(entries) if j != k and _matches(e, item["match"])]
        where = (f"it appears as entry {elsewhere[0]} instead: checklist out of order"
                 if elsewhere else "none of its match terms appear in the section")
        yield Finding(path, f"answer_checklist item {item['id']!r} (#{k + 1}) is not entry "
                            f"{k + 1} of the Answer checklist; {where} "
                            f"(match: {', '.join(item['match'])})")


def numeric_leaves(obj: Any) -> Iterator[int | float]:
    """Every number in a nested structure (booleans are not numbers)."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, int | float):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from numeric_leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from numeric_leaves(v)


def _decimal(text: str) -> Decimal | None:
    try:
        return abs(Decimal(text)).normalize()
    except InvalidOperation:
        return None


def numbers_in_text(text: str) -> set[Decimal]:
    """Absolute values of the decimal numbers written in a text."""
    return {d for d in (_decimal(m) for m in _NUMBER.findall(text)) if d is not None}


def _lint_numbers(path: str, text: str, card: dict[str, Any]) -> Iterator[Finding]:
    present = numbers_in_text(text)
    for table in card["measured_results"]:
        missing = sorted({repr(v) for v in numeric_leaves([table.get("setup", {}),
                                                           table["rows"]])
                          if _decimal(repr(v)) not in present})
        if missing:
            yield Finding(path, f"measured_results {table['id']!r}: {', '.join(missing)} not "
                                "found in SKILL.md or the references it links; every measured "
                                "number must appear there")


def _lint_rule_ids(path: str, card: dict[str, Any], rule_ids: set[str] | None
                   ) -> Iterator[Finding]:
    if rule_ids is None:
        return  # no validator catalog yet
    named = set(card["rules"])
    named |= {c["rule"] for c in card["known_constraints"] if "rule" in c}
    named |= {f["rule"] for f in card["failure_modes"] if "rule" in f}
    for rid in sorted(named - rule_ids):
        yield Finding(path, f"rule id {rid!r} is not in the validator catalog "
                            "(`mbridge-perf validate --list-rules`)")


def _lint_cases(path: str, cases: list[dict[str, Any]], skill_name: str,
                card: dict[str, Any] | None) -> Iterator[Finding]:
    positive = [c for c in cases if c["expected_skill"] is not None]
    negative = [c for c in cases if c["expected_skill"] is None]
    if len(positive) < MIN_POSITIVE_CASES:
        yield Finding(path, f"{len(positive)} positive case(s); at least {MIN_POSITIVE_CASES} "
                            f"with expected_skill {skill_name!r}")
    if len(negative) < MIN_NEGATIVE_CASES:
        yield Finding(path, "no negative case; add one with expected_skill null (an adjacent "
                            "question this skill must not claim)")
    ids = [c["id"] for c in cases]
    for cid in sorted({i for i in ids if ids.count(i) > 1}):
        yield Finding(path, f"duplicate case id {cid!r}")
    checklist_ids = [i["id"] for i in card["answer_checklist"]] if card else None
    for case in cases:
        kind = "negative" if case["expected_skill"] is None else "positive"
        if f"-{kind}-" not in case["id"]:
            yield Finding(path, f"case {case['id']!r}: expected_skill makes it {kind}; put "
                                f"'-{kind}-' in its id")
        if case["expected_skill"] not in (None, skill_name):
            yield Finding(path, f"case {case['id']!r}: expected_skill "
                                f"{case['expected_skill']!r} is not this skill ({skill_name!r})")
        wanted = case.get("checks", {}).get("checklist", [])
        if checklist_ids is not None:
            unknown = [w for w in wanted if w not in checklist_ids]
            if unknown:
                yield Finding(path, f"case {case['id']!r}: checks.checklist names "
                                    f"{', '.join(unknown)}, not in card.yaml answer_checklist")
            elif [checklist_ids.index(w) for w in wanted] != sorted(
                    checklist_ids.index(w) for w in wanted):
                yield Finding(path, f"case {case['id']!r}: checks.checklist is not in the "
                                    "card's answer_checklist order")
