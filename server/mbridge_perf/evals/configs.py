"""The config an answer writes, checked by the project's own validator.

Why: a forbidden combination (pad-to-capacity with flex + DeepEP, EP overlap with ``moe`` in
``recompute_modules``, layer offloading with recompute) is the same mistake in any wording, and
``validate_config`` already knows every one of them with Megatron-Core parity. So the settings
an answer writes are applied to a neutral base (BF16 mixed precision, as every Bridge recipe; a
MoE model when the answer sets MoE knobs) and validated:
- in code, a line ``cfg.model.X = value`` (in a diff, the context and added lines; an inline
  mention such as "`model.cpu_offloading=True` raises" is no setting);
- in JSON, ``"model.X": value`` override maps or a field only one section has (a
  submit_benchmark payload, a sweep's jobs); each item of a JSON list is an alternative, judged
  apart together with the settings outside the lists;
- in a YAML config block (read under the config loader's limits), the same way as JSON, a field
  nested under its section (``comm_overlap:`` / ``overlap_moe_expert_parallel_comm: true``)
  resolving to that section.
An error counts against the answer only when at least two of the fields it names were set by
the answer itself: a combination the answer wrote, not a default of our base or a field it left
unsaid - so every ``field=value`` the error message names must be one the answer set
("check_for_nan_in_loss=True (the default)" or an unset EP 1 is an omission, judged elsewhere,
not a wrong combination).

Bounded: at most MAX_SETTINGS code settings and MAX_JSON_NODES JSON values are read, code
values are Python literals of at most 200 characters (``ast.literal_eval``: no names, no
calls), and the validator runs at most MAX_CONFIGS times.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from typing import Any

from mbridge_perf.evals.keys import allowlist
from mbridge_perf.evals.text import Unit, clip, is_recommended

MAX_SETTINGS = 64
MAX_JSON_NODES = 2000
MAX_CONFIGS = 8
# "cfg.model.X = v" / "model.X = v"; not "model.X=v", the grader's own rendering of a JSON
# entry (read from the JSON itself) and a Hydra override's spelling
_PY_SET = re.compile(r"^\s{0,8}(?:(?:cfg|config|conf|recipe|c)\.([a-z_]{2,20})\."
                     r"([a-z][a-z0-9_]{1,60})\s{0,4}|([a-z_]{2,20})\.([a-z][a-z0-9_]{1,60})\s{1,4})="
                     r"\s{0,4}([^#\n]{1,200}?)\s{0,40}(?:#.*)?$")
# "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True": the job environment (env.NAME)
_ENV_SET = re.compile(r"^\s{0,8}export\s{1,4}([A-Z][A-Z0-9_]{2,60})=[\"']?([\w.,:=+-]{1,120})"
                      r"[\"']?\s{0,40}(?:#.*)?$")
_NAMED = re.compile(r"\b([a-z][a-z0-9_]{2,60})=")
Settings = dict[str, tuple[Any, Unit]]  # "section.field" -> (value, the unit that set it)
_MOE_BASE = {"model.num_moe_experts": 64, "model.moe_router_topk": 8,
             "model.moe_grouped_gemm": True}


@dataclass(frozen=True, slots=True)
class ConfigFinding:
    """A validator error on settings the answer wrote."""

    rule_id: str
    message: str
    unit: Unit

    @property
    def evidence(self) -> str:
        return (f"writes a config validate_config refuses ({self.rule_id}: "
                f"{clip(self.message, 160)}), in: {clip(self.unit.text, 160)}")


def _value(raw: str) -> tuple[bool, Any]:
    raw = raw.strip().rstrip(",;")
    low = raw.lower()
    if low in ("true", "false"):
        return True, low == "true"
    if low in ("none", "null"):
        return True, None
    try:
        return True, ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False, None


# A line comment that forbids a further change with its own object ("# do NOT add "moe":
# dropless model"): advice about another edit, not a verdict on the line it sits on ("# do not
# use this", "# wrong" still are).
_OTHER_EDIT = re.compile(r"#\s{0,4}(?:do not|don'?t|never|no need to)\s+(?:add|set|put|use|enable|"
                         r"include|append|raise|lower|touch)\s+(?!(?:this|it|that|these|here)\b)\S")


def _own_words(u: Unit) -> Unit:
    """The code line without a comment that forbids another edit."""
    m = _OTHER_EDIT.search(u.norm)
    return replace(u, norm=u.norm[:m.start()]) if m else u


def settings(units: list[Unit]) -> Settings:
    """``section.field`` -> (value, the unit that set it), for known fields only; a setting
    inside a rejected clause or quoted output is no setting (the last one wins)."""
    al = allowlist()
    out: Settings = {}
    for u in units:
        if u.quoted or u.negated_section or len(out) >= MAX_SETTINGS:
            continue
        text = u.text.replace("`", "")
        if text.startswith("-"):  # a diff's removed line: not in the config it leaves
            continue
        env = _ENV_SET.match(text)
        if env and is_recommended(u, 0, len(u.norm)):
            out[f"env.{env.group(1)}"] = (env.group(2), u)
            continue
        m = _PY_SET.match(text[1:] if text.startswith("+") else text)
        if m:
            sec, name, raw = m.group(1) or m.group(3), m.group(2) or m.group(4), m.group(5)
            pos = u.norm.find(name)
            ok, value = _value(raw)
            if ok and name in al.sections.get(sec, ()) and (
                    pos < 0 or is_recommended(_own_words(u), pos, pos + len(name))):
                out[f"{sec}.{name}"] = (value, u)
    return out


def _json_key(key: str, al: Any, under: str = "") -> str | None:
    """``model.recompute_modules`` as written, a field of the section it is nested ``under``,
    or a bare field that only one section has."""
    sec, dot, name = key.partition(".")
    if dot:
        return key if name in al.sections.get(sec, ()) else None
    if under and key in al.sections.get(under, ()):
        return f"{under}.{key}"
    owners = [s for s, names in al.sections.items() if key in names]
    return f"{owners[0]}.{key}" if len(owners) == 1 else None


def _json_groups(data: Any, where: Unit) -> tuple[Settings, list[Settings]]:
    """A JSON value's settings: those outside any list (one config the answer states), and
    each list item's own (alternatives: jobs of a sweep, candidates; an item that names an
    earlier sibling builds on it), read breadth-first over at most MAX_JSON_NODES values."""
    al = allowlist()
    shared: Settings = {}
    alts: list[Settings] = []
    base: dict[int, int] = {}   # item -> the sibling it builds on (indices into alts)
    # (a value, the settings it adds to, the config section it stands under: "comm_overlap:"
    # in a YAML block names the section of the fields nested in it)
    todo: list[tuple[Any, Settings, str]] = [(data, shared, "")]
    seen = 0
    while todo and seen < MAX_JSON_NODES:
        node, into, sec = todo.pop(0)
        seen += 1
        if isinstance(node, list):
            named: dict[str, int] = {}
            for item in node[:MAX_JSON_NODES]:
                alts.append({})
                todo.append((item, alts[-1], sec))
                _link_sibling(item, len(alts) - 1, named, base)
        elif isinstance(node, dict):
            for k, v in list(node.items())[:MAX_JSON_NODES]:
                key = _json_key(k, al, sec) if isinstance(k, str) else None
                if key is not None and not isinstance(v, dict):
                    into[key] = (v, where)
                elif isinstance(v, (dict, list)):
                    todo.append((v, into, k if k in al.sections else sec))
    return shared, [_resolved(i, alts, base) for i, g in enumerate(alts) if g]


_NAME_KEYS = ("id", "name")


def _link_sibling(item: Any, at: int, named: dict[str, int], base: dict[int, int]) -> None:
    """A list item whose value names an earlier sibling ("compare_to": "ep_overlap_plain")
    builds on it."""
    if not isinstance(item, dict):
        return
    for k, v in list(item.items())[:32]:
        if k not in _NAME_KEYS and isinstance(v, str) and v in named:
            base[at] = named[v]
            break
    for k in _NAME_KEYS:
        if isinstance(item.get(k), str):
            named.setdefault(item[k], at)


def _resolved(at: int, alts: list[Settings], base: dict[int, int]) -> Settings:
    """An item's settings over those of the siblings it builds on (links point back, so the
    chain ends)."""
    chain = [at]
    while chain[-1] in base and len(chain) < 8:
        chain.append(base[chain[-1]])
    out: Settings = {}
    for i in reversed(chain):
        out.update(alts[i])
    return out


def config_errors(units: list[Unit], blocks: list[Any] | None = None,
                  limit: int = 3) -> list[ConfigFinding]:
    """Validator errors on a combination of at least two settings the answer wrote: in its code
    lines and its JSON (each list item of a JSON sweep judged with the shared settings)."""
    code = settings(units)
    where = units[0] if units else Unit(text="(the answer's JSON)", norm="", index=0)
    configs = [code] if len(code) >= 2 else []
    for data in (blocks or [])[:4]:
        shared, alts = _json_groups(data, where)
        configs += [{**code, **shared, **alt} for alt in alts or [{}]]
    out: list[ConfigFinding] = []
    for got in configs[:MAX_CONFIGS]:
        for f in _validated(got):
            if f.rule_id not in {o.rule_id for o in out}:
                out.append(f)
        if len(out) >= limit:
            break
    return out[:limit]


def _typed(cfg: Any, key: str, value: Any) -> Any:
    """``cfg`` when ``value`` has the type its field declares, else ValueError: apply_changes
    copies values in unchecked (its own come typed), and an answer's "[...]" or [1] in
    recompute_modules would reach the rules as a non-string label."""
    section, _, name = key.partition(".")
    current = getattr(cfg, section)
    if name in getattr(type(current), "model_fields", {}):
        type(current).__pydantic_validator__.validate_assignment(current.model_copy(), name,
                                                                 value)
    return cfg


def _answers_gap(message: str, names: set[str]) -> str | None:
    """The part of the message whose named values ("X=True with Y=1") are all ones the answer
    wrote: the whole message, or its head with one of its "; "-separated gaps ("X=True with
    EP=1 (needs > 1); moe_shared_expert_overlap=True": the second gap is the answer's own even
    when EP is not); None when no part is."""
    parts = message.split("; ")
    if set(_NAMED.findall(message)) <= names:
        return message
    head, _, _ = parts[0].partition(" with ")
    for p in parts[1:]:
        if set(_NAMED.findall(head)) | set(_NAMED.findall(p)) <= names:
            return f"{head} with {p}"
    return None


def _validated(got: Settings) -> list[ConfigFinding]:
    """The errors of one config the answer states (see the module docstring)."""
    from mbridge_perf.advise.changes import apply_changes
    from mbridge_perf.config.errors import ConfigError
    from mbridge_perf.config.load import load_config
    from mbridge_perf.rules.validate import validate

    got = dict(got)
    if len(got) < 2:
        return []
    cfg = load_config(data={"mixed_precision": {"bf16": True, "fp8": None}})
    if any("moe" in k or "expert" in k for k in got):
        cfg = apply_changes(cfg, _MOE_BASE)
    for key, (value, _) in list(got.items()):
        try:
            cfg = _typed(apply_changes(cfg, {key: value}), key, value)
        except (ConfigError, ValueError, TypeError, AttributeError):
            del got[key]  # not applied: not judged either
    out: list[ConfigFinding] = []
    names = {k.rsplit(".", 1)[-1] for k in got}
    for f in validate(cfg).findings:
        mine = [k for k in f.fields if k in got]
        said = _answers_gap(f.message, names) if f.severity == "error" else None
        if said is not None and len(mine) >= 2:
            out.append(ConfigFinding(f.rule_id, said, got[mine[-1]][1]))
    return out
