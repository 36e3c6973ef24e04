"""Read an answer — Markdown with optional YAML front matter, or the JSON a tool returned — into
units for matching, its JSON blocks for paths and numbers, and the tool calls it records."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.limits import load_yaml
from mbridge_perf.evals.text import (
    Unit,
    heading_flags,
    kept_intro,
    negated_intro,
    normalise,
    unit_is_late,
)

MAX_ANSWER_BYTES = 1_000_000
_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_FENCE = re.compile(r"^\s*(```|~~~)\s*([A-Za-z0-9_-]*)")
_LIST = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(?:\[[ xX]\]\s+)?")  # "- [ ] ...": a task item
# a numbered item, or a bullet that names its step ("- [ ] **ステップ 2: ...**", "- Step 3: ...")
_ORDERED = re.compile(r"^\s*(?:\d+[.)]\s"
                      r"|[-*+]\s+(?:\[[ xX]\]\s+)?(?:\*\*|__)?(?:step|ステップ)\s?\d)",
                      re.IGNORECASE)
# A bold step head on a line of its own ("**1. Raise PP**", "__2) Then X__") is an ordered list
# item too; the emphasis opening it goes with the number.
_BOLD_STEP = re.compile(r"^\s*(?:\*\*|__)\s?(?=\d{1,2}[.)]\s)")
# A line led by a bullet symbol or a check / cross / warning mark is a list item too; the mark
# stays in its text (a cross is a rejection: "❌ raise TP").
_MARK = re.compile(r"^\s*[•▪▸►✅✔✓☑❌✗✘⚠🚫]")
# A sentence ends at . ! ? — also before closing emphasis or code ("**Step one.** Then") and
# before an inline step number ("... contract. 2) fit ...").
_SENTENCE = re.compile(r"(?<=[.!?])[*_`]{0,2}\s+(?=[A-Za-z(`*\"']|\d{1,2}\) )")
# Sentence ends that are not: abbreviations before a lower-case word ("e.g. fused", "vs. 8").
_ABBREV = re.compile(r"(?:\b(?:e\.g|i\.e|vs|etc|approx|cf|incl|resp|no|fig|eq|ca)\.|\b[A-Za-z]\.)$")


# A fence without a language, or one named for program output, that quotes a line with no
# assignment and no command ("AssertionError: ...", "cuda_gpu_kern_sum: ... 38.2 %"): the
# program's words, not the answer's, so they assert and recommend nothing.
_OUTPUT_FENCES = frozenset({"", "text", "txt", "log", "console", "output", "plaintext"})
# A blockquoted line ("> Enabling EP overlap took ...", "> `recompute_modules: [up_proj]`"): a
# review quoting the user's words, diff or log, not the answer's own advice. A callout ("> **Note:**
# ...", "> [!TIP]") is the answer's own; a config line is quoted even when its section starts
# like a callout word ("> note.x = 1").
_BLOCKQUOTE = re.compile(r"^\s*>\s?(?:`?[A-Za-z]\w{0,40}[_.][\w.\[\]-]{0,80} ?[:=] ?\S"
                         r"|(?!\s*(?:\*\*)?(?:\[!|note|tip|warning|important|caution|tl;?dr|rule|"
                         r"summary|answer|short answer|bottom line|recommendation)\b)\s*\S)",
                         re.IGNORECASE)
_COMMAND_LINE = re.compile(r"=|^\s*(?:[$>#-]|export\b|python|torchrun|srun|sbatch|bash\b|"
                           r"nsys\b|grep\b|uv\b|pip\b)")


def _sentences(text: str) -> list[str]:
    """Prose into sentences; a chat-style lower-case start after a full stop also splits."""
    out: list[str] = []
    last = 0
    for m in _SENTENCE.finditer(text):
        head = text[last:m.start()]
        if text[m.end()].islower() and _ABBREV.search(head[-8:]):
            continue
        out.append(head)
        last = m.end()
    out.append(text[last:])
    return out


class AnswerError(ValueError):
    """The answer file cannot be read; the message names the file and the problem."""


@dataclass
class Answer:
    """What the grader sees of one answer."""

    text: str
    units: list[Unit]
    json_blocks: list[Any] = field(default_factory=list)
    tool_calls: list[str] | None = None
    # the mappings of the YAML config blocks the answer writes (its advice, not a state shown)
    yaml_configs: list[Any] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def data(self) -> Any:
        """The first JSON value (a tool's output, or a fenced json block), or None."""
        return self.json_blocks[0] if self.json_blocks else None


def tool_name(name: str) -> str:
    """mcp__mbridge__estimate_memory -> estimate_memory."""
    return name.rsplit("__", 1)[-1].strip()


def load_answer(path: Path) -> Answer:
    try:
        with path.open("rb") as f:  # bounded: a device such as /dev/zero never ends
            raw = f.read(MAX_ANSWER_BYTES + 1)
    except OSError as exc:
        raise AnswerError(f"{path}: cannot read the answer: {exc.strerror}") from None
    if len(raw) > MAX_ANSWER_BYTES:
        raise AnswerError(f"{path}: answer is larger than {MAX_ANSWER_BYTES} bytes, the limit")
    try:
        return parse_answer(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise AnswerError(f"{path}: answer is not UTF-8 text") from None
    except AnswerError as exc:
        raise AnswerError(f"{path}: {exc}") from None


def parse_answer(text: str, tool_calls: list[str] | None = None) -> Answer:
    """Markdown (front matter: tool_calls, verdict, reason, ...) or a tool's JSON output."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(stripped)
        except (json.JSONDecodeError, RecursionError):  # not JSON we can use: read as text
            data = None
        if data is not None:
            return from_json(data, tool_calls)
    meta: dict[str, Any] = {}
    m = _FRONT.match(text)
    if m:
        try:
            meta = load_yaml(m.group(1), "front matter") or {}
        except ConfigError as exc:  # an alias bomb or nesting in an untrusted answer's header
            raise AnswerError(str(exc)) from None
        except yaml.YAMLError as exc:
            raise AnswerError(f"front matter is not valid YAML: {' '.join(str(exc).split())}"
                              ) from None
        if isinstance(meta, dict):
            text = text[m.end():]
        else:  # "---" opening a slide deck or a list: a horizontal rule, not front matter
            meta = {}
    calls = meta.get("tool_calls", tool_calls)
    if calls is not None and not (isinstance(calls, list)
                                  and all(isinstance(c, str) for c in calls)):
        raise AnswerError("front matter tool_calls must be a list of tool names")
    units, blocks = split_units(text)
    json_blocks, yaml_configs = _apart(blocks)
    return Answer(text=text, units=units, json_blocks=json_blocks,
                  tool_calls=[tool_name(c) for c in calls] if calls is not None else None,
                  meta=meta, yaml_configs=yaml_configs)


def from_json(data: Any, tool_calls: list[str] | None = None) -> Answer:
    """A tool's output: grade its answer_markdown, keep the JSON for paths and numbers."""
    md = data.get("answer_markdown") if isinstance(data, dict) else None
    body = md if isinstance(md, str) else ""
    units, blocks = split_units(body)
    if not body:
        units = _recommendation_units(data, 0)
    return Answer(text=body, units=units, json_blocks=[data, *_apart(blocks)[0]],
                  tool_calls=[tool_name(c) for c in tool_calls] if tool_calls else tool_calls)


def _apart(blocks: list[Any]) -> tuple[list[Any], list[Any]]:
    """split_units' blocks as (the JSON values, the YAML config mappings)."""
    return ([b for b in blocks if not isinstance(b, YamlConfig)],
            [b.data for b in blocks if isinstance(b, YamlConfig)])


# A list of knob entries under another name ("levers": [{rank, knob, value, expected_effect}]);
# one under a rejecting name ("blocked": [{knob, why}]) lists what not to do.
_KNOB_FIELDS = ("knob", "setting", "flag", "param", "parameter")
_REJECTING = re.compile(r"^(?:blocked|rejected|avoid\w*|do_?not\w*|dont\w*|not_recommended|"
                        r"ruled_out|forbidden|excluded)$")
# a layout's parallel sizes ({"tp": 4, "pp": 8, "dp": 1}) as one statement "tp=4, pp=8, dp=1"
_SIZE_KEYS = frozenset({"tp", "pp", "vpp", "cp", "ep", "etp", "dp", "edp"})


def _knob_list(value: Any) -> list[dict[str, Any]]:
    items = [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []
    return items if items and all(any(f in r for f in _KNOB_FIELDS) for r in items) else []


def _by_rank(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(items, key=lambda r: r.get("rank", 0) if isinstance(r.get("rank"), int | float)
                  else 0)


def _recommendation_units(data: Any, start: int) -> list[Unit]:
    """A structured recommendation list as ordered units: the "recommendations" list when there
    is one ({rank, knob, value, rationale, ...}), else the first list of knob entries under any
    key; each entry read with its prose fields (rationale, expected effect, cost, note), every
    list under a rejecting key as rejected units, and the layout's sizes."""
    if not isinstance(data, dict):
        return []
    out: list[tuple[str, bool]] = []
    layout = data.get("layout")
    if isinstance(layout, dict):
        sizes = [f"{k}={v}" for k, v in layout.items()
                 if str(k).lower() in _SIZE_KEYS and isinstance(v, int)]
        if sizes:
            out.append((f"layout: {', '.join(sizes)}", False))
    recs = data.get("recommendations")
    found = isinstance(recs, list)
    if found:
        out += [(_entry_text(r), False) for r in _by_rank([r for r in recs
                                                             if isinstance(r, dict)])[:64]]
    for key, value in data.items():
        items = _knob_list(value)
        rejecting = bool(_REJECTING.match(str(key).lower()))
        if not items or (found and not rejecting):
            continue
        found = found or not rejecting
        out += [(_entry_text(r), rejecting) for r in (items if rejecting else _by_rank(items))[:64]]
    if not found:
        return []
    return [Unit(t, normalise(t), start + k, unit_is_late(normalise(t)), negated_section=neg)
            for k, (t, neg) in enumerate(out)]


def _entry_text(r: dict[str, Any]) -> str:
    """One knob entry as a statement: ``knob=value — its prose fields``."""
    knob = next((str(r[f]) for f in _KNOB_FIELDS if f in r), "")
    text = f"{knob}={_scalar(r['value'])}" if "value" in r else knob
    prose = [v for v in r.values() if isinstance(v, str) and _PROSE.search(v)]
    return " — ".join([text, *prose]) if text else " — ".join(prose)


# A JSON value read as prose: a string of at least two words (not an id, path or one label).
_PROSE = re.compile(r"\S \S")  # two words (\S+ would rescan each start: quadratic)


def _json_prose(data: Any, depth: int = 0) -> list[str]:
    """The prose strings of a JSON value, in document order (bounded depth and count); a
    setting keyed by its config path ({"model.cuda_graph_modules": ["moe"]}) reads as
    ``model.cuda_graph_modules=[moe]``."""
    if depth > 8:
        return []
    if isinstance(data, str):
        return [data] if _PROSE.search(data) else []
    if isinstance(data, dict):
        pairs = list(data.items())
    else:
        pairs = [(None, v) for v in data] if isinstance(data, list) else []
    out: list[str] = []
    for k, v in pairs:
        if isinstance(k, str) and _REVIEWED_KEY.match(k):
            continue
        if (isinstance(k, str) and _CONFIG_PATH.match(k)
                and isinstance(v, str | int | float | bool | list)):
            out.append(f"{k}={_scalar(v)}")
        else:
            out += _json_prose(v, depth + 1)
        if len(out) >= 400:
            break
    return out


# A JSON key whose value is what a report checks, not its advice ("claim_checked", "question",
# "user_claim", "as_posted").
_REVIEWED_KEY = re.compile(r"^(?:(?:user|original|quoted)_)?"
                           r"(?:claim|quote|question|statement|input)"
                           r"(?:_(?:checked|reviewed|under_review|as_posted))?$|^as_posted$")


# A JSON key that is a config path ("model.cuda_graph_modules", "optimizer.optimizer_cpu_offload").
# "env.PYTORCH_CUDA_ALLOC_CONF": the job environment, as the validator names it
_CONFIG_PATH = re.compile(r"^(?:[a-z_]{1,30}\.[a-z_][a-z0-9_]{1,60}|env\.[A-Z][A-Z0-9_]{1,60})$")


def _scalar(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, bool) else str(value)


# A unit's length bound: judging a match scans its clause, so one unbroken 200 KB "sentence"
# would cost time quadratic in its length; real sentences and list items are far shorter.
MAX_UNIT_CHARS = 2_000


def _bounded(piece: str) -> list[str]:
    """A piece of text as units of at most MAX_UNIT_CHARS, cut at spaces where it can be."""
    out = []
    while len(piece) > MAX_UNIT_CHARS:
        cut = piece.rfind(" ", 0, MAX_UNIT_CHARS)
        cut = cut if cut > MAX_UNIT_CHARS // 2 else MAX_UNIT_CHARS
        out.append(piece[:cut])
        piece = piece[cut:].lstrip()
    return [*out, piece] if piece else out


# A chat thread's speaker tag at the start of a line: "**@lena** ...", "**dana:** ...", "@kai: ..."
# (a lower-case handle in bold, or any name after "@"; "**Status**" is a label, not a speaker).
_SPEAKER = re.compile(r"^\s{0,3}(?:\*\*@?([a-z][\w.-]{0,24}[a-z0-9])(?::\*\*|\*\*:?)"
                      r"|\*\*@([A-Za-z][\w.-]{0,24})(?::\*\*|\*\*:?)|@([A-Za-z][\w.-]{0,24}):)\s")
# the answering side of a thread names itself so ("perf-bot", "mem-helper", "perf-oncall")
_ANSWERER = re.compile(r"bot|help|oncall|perf|assist|agent|\bai\b")


def _speaker(line: str) -> str | None:
    m = _SPEAKER.match(line)
    return next((g for g in m.groups() if g), None) if m else None


def thread_users(text: str) -> set[str]:
    """In a chat thread (two or more speakers), the speakers who are not the one answering: the
    answerer names itself as a helper or bot, else it is the second to speak (the first asks).
    Their lines are the user's words, quoted, not the answer's advice."""
    order: list[str] = []
    for line in text.splitlines():
        name = _speaker(line)
        if name is not None and name.lower() not in order:
            order.append(name.lower())
    if len(order) < 2:
        return set()
    answerer = next((n for n in order if _ANSWERER.search(n)), order[1])
    return set(order) - {answerer}


def _state(text: str) -> dict[str, Any]:
    """split_units' reading state: the paragraph / list item number; whether it is a list item,
    an ordered one; whether a negated lead-in ("Things I would not do:") governs the list items
    that follow it; the thread's user speakers and whether the current line is theirs."""
    return {"block": 0, "item": False, "ordered": False, "list_neg": False, "list_kept": False,
            "parent": -1, "fences": 0, "users": thread_users(text), "user": False}


def _new_voice(line: str, st: dict[str, Any]) -> bool:
    """Whether a thread speaker starts talking on this line (and whether it is a user)."""
    name = _speaker(line)
    if name is not None:
        st["user"] = name.lower() in st["users"]
    return name is not None


def split_units(text: str) -> tuple[list[Unit], list[Any]]:
    """Markdown into units: sentences of prose, list items, table rows, code lines; fenced
    JSON blocks are parsed (their recommendation lists become units where the block stands)."""
    units: list[Unit] = []
    blocks: list[Any] = []
    neg = late = False
    fence: str | None = None
    code: list[str] = []
    para: list[str] = []

    st = _state(text)

    def add(piece: str, lead: bool = False, quoted: bool = False) -> None:
        for chunk in _bounded(piece.strip()):
            norm = normalise(chunk)
            units.append(Unit(chunk, norm, len(units), late or unit_is_late(norm),
                              neg or st["list_neg"], lead=lead, block=st["block"],
                              kept=bool(st["list_kept"]) and st["item"],
                              quoted=quoted or bool(st["user"])))
            lead = False

    def flush() -> None:
        if para:
            whole = " ".join(para)
            if not st["item"]:
                st["list_neg"] = st["list_kept"] = False
            for k, sentence in enumerate(_sentences(whole)):
                add(sentence, lead=st["ordered"] and k == 0)
            if not st["item"]:
                st["list_neg"] = negated_intro(whole)
                st["list_kept"] = kept_intro(whole)
            para.clear()
        st["block"] += 1
        st["item"] = st["ordered"] = False

    for line in text.splitlines():
        line = _BOLD_STEP.sub("", line, count=1)
        fm = _FENCE.match(line)
        if fence is not None:
            if fm and fm.group(1) == fence[:3]:
                _close_fence(fence, code, blocks, units, add, st.get("review", False))
                fence, code = None, []
            else:
                code.append(line)
            continue
        if fm:
            flush()
            fence = fm.group(1) + fm.group(2).lower()
            st["review"], st["fences"] = under_review(units, st["fences"]), st["fences"] + 1
            continue
        if st["users"] and _new_voice(line, st):
            flush()
        if _BLOCKQUOTE.match(line):
            flush()
            add(line.lstrip(" >"), quoted=True)
            continue
        h = _HEADING.match(line)
        if h:
            flush()
            neg, late = heading_flags(h.group(2))
            st["list_neg"] = st["list_kept"] = False
            continue
        if (not line.strip() or _LIST.match(line) or _MARK.match(line)
                or line.lstrip().startswith("|")):
            flush()
            _track_parent(line, st)
        if line.lstrip().startswith("|"):
            if not set(line.strip()) <= set("|-: "):
                add(line)
            continue
        if line.strip():
            if not para:
                st["item"] = bool(_LIST.match(line) or _MARK.match(line))
                st["ordered"] = bool(_ORDERED.match(line))
            para.append(_LIST.sub("", line, count=1).strip() if _LIST.match(line) else line)
    flush()
    if fence is not None:
        _close_fence(fence, code, blocks, units, add, st.get("review", False))
    return _reviewed_opening(units, text), blocks


def _track_parent(line: str, st: dict[str, Any]) -> None:
    """A nested list item belongs to its parent's block; a top-level item or mark line is the
    parent of what nests under it; other text ends the nesting."""
    if _LIST.match(line) and line[:2].isspace() and st["parent"] >= 0:
        st["block"] = st["parent"]
    elif _LIST.match(line) or _MARK.match(line):
        st["parent"] = st["block"]
    elif line.strip():
        st["parent"] = -1


def _close_fence(fence: str, code: list[str], blocks: list[Any], units: list[Unit],
                 add: Any, review: bool = False) -> None:
    body = "\n".join(code)
    if fence.endswith("json") or body.lstrip().startswith("{"):
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, RecursionError):  # not JSON we can use: read as text
            data = None
        if data is not None:
            blocks.append(data)
            recs = _recommendation_units(data, len(units))
            units.extend(recs)
            if not recs:
                # a report written as JSON (a verdict and its rationale): its prose values
                # are sentences like any other
                for prose in _json_prose(data):
                    for sentence in _sentences(prose):
                        add(sentence)
            return
    lang = fence[3:]
    output = lang in _OUTPUT_FENCES
    shown = (lang not in _SHELL_FENCES and bool(code)
             and (review or _STATE_SHOWN.match(code[0]) is not None))
    if lang in ("yaml", "yml") and not shown:
        blocks += _yaml_config(body)
    lines = _join_comments(code)
    for i, line in enumerate(lines):
        # a command whose next line is an error is the failing run shown, not advice
        failed = i + 1 < len(lines) and _ERROR_LINE.match(lines[i + 1]) is not None
        # a line a diff removes is the state being replaced, not advice
        removed = lang == "diff" and line.startswith("-") and not line.startswith("---")
        add(line, quoted=shown or failed or removed
            or (output and not _COMMAND_LINE.search(line)))


@dataclass(frozen=True)
class YamlConfig:
    """A YAML config block the answer writes ("model:\n  recompute_modules: [moe]")."""

    data: dict[str, Any]


def _yaml_config(body: str) -> list[YamlConfig]:
    """The block as a config mapping, read under the config loader's limits (size, depth,
    aliases); a block that is not a mapping, or not YAML, is none."""
    try:
        data = load_yaml(body, "answer yaml block")
    except (ConfigError, yaml.YAMLError, RecursionError):
        return []
    return [YamlConfig(data)] if isinstance(data, dict) else []


# The first line a failing command prints ("error: unrecognized arguments: layernorm",
# "ValueError: ...", "Traceback (most recent call last):").
_ERROR_LINE = re.compile(r"^\s*(?:[A-Za-z.]{0,40}(?:error|exception)\b|usage:|traceback\b)",
                         re.IGNORECASE)


# The lead-in of a block the answer reviews ("Requesting changes on `recompute_modules`:",
# "Your diff:", "The config as posted:"); for a block the answer opens with, see _REVIEW_VERDICT.
_REVIEW_LEAD = re.compile(r"(?:requesting changes|changes requested|\byour (?:diff|config|change|"
                          r"patch|pr|yaml|script|snippet|block|code)\b|as (?:posted|written|"
                          r"submitted|proposed)|you (?:posted|wrote|pasted|sent|proposed)\b)"
                          r"[^\n]{0,120}:\s*$", re.IGNORECASE)


# The verdict that follows a block an answer opens with when the block is the change reviewed
# ("**Comment (blocking):** ...", "Requesting changes: ...", "Review: ...").
_REVIEW_VERDICT = re.compile(r"^\W{0,6}(?:review\w*|comment\w*|blocking|requesting changes|"
                             r"changes requested|nit\b|verdict|do not merge|not ready)",
                             re.IGNORECASE)


def _reviewed_opening(units: list[Unit], text: str) -> list[Unit]:
    """The lines of the block an answer opens with, quoted when a review verdict follows the
    block: the diff under review, not the answer's advice."""
    if not units or not _FENCE.match(text):  # its \s* passes blank lines: no copy of the text
        return units
    n = next((i for i, u in enumerate(units) if u.block != units[0].block), 0)
    if n and _REVIEW_VERDICT.match(units[n].text):
        return [replace(u, quoted=True) for u in units[:n]] + units[n:]
    return units


# A review that opens by asking for changes ("**Requesting changes.**", "Blocking: ...").
_CHANGES_ASKED = re.compile(r"^\W{0,6}(?:requesting changes|changes requested|blocking|"
                            r"do not merge|not ready)", re.IGNORECASE)


def under_review(units: list[Unit], fences: int = 0) -> bool:
    """Whether a fenced block about to open shows the state the answer reviews, not advice:
    one under a review lead-in, or the first block, close under a verdict that asks for
    changes (``fences``: the blocks opened before this one)."""
    if not units:
        return False
    opened = fences == 0 and len(units) <= 3 and _CHANGES_ASKED.match(units[0].text) is not None
    return opened or _REVIEW_LEAD.search(units[-1].text) is not None


_SHELL_FENCES = frozenset({"bash", "sh", "shell", "zsh", "console", "shell-session"})
# A config block headed by a comment saying it shows what the user has ("# current config", "# what
# the resolved config will show", "# before"): the settings it lists are the state, not advice.
_STATE_SHOWN = re.compile(r"^\s*(?:#|//)\s*(?:what )?(?:the |your )?(?:current|existing|resolved"
                          r"|before\b|as[- ]is\b|what you have|your (?:config|setup|yaml))",
                          re.IGNORECASE)


# A whole-line comment of a config or script ("# Next rung: recompute the FFN. It takes ...").
_COMMENT = re.compile(r"^\s*(?:#|//)\s?(?!!)")
# A comment line that carries on the sentence above it: it opens in lower case, a digit or a
# parenthesis ("# inside the 5 % gate ...", "# (~3 GB). The cost ...").
_CARRY_ON = re.compile(r"^[a-z0-9(~]")
_ENDS = (".", "!", "?", ":")


def _join_comments(code: list[str]) -> list[str]:
    """Code lines, with a sentence wrapped over several whole-line comments read as one (its
    subject on one line, its verdict on the next), split again at sentence ends. A comment
    line that opens a new thought (a capital, after a full stop or a colon) stays its own."""
    out: list[str] = []
    prose: list[list[str]] = []    # the logical comment lines of the current run, in parts

    def close() -> None:
        out.extend(f"# {t.strip()}" for p in prose for t in _sentences(" ".join(p)) if t.strip())
        prose.clear()

    for line in code:
        m = _COMMENT.match(line)
        body = line[m.end():].strip() if m else ""
        if not body:
            close()
            out.append(line)
        elif prose and _CARRY_ON.match(body) and not prose[-1][-1].endswith(_ENDS):
            prose[-1].append(body)
        else:
            prose.append([body])
    close()
    return out
